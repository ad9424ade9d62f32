-- Sealed credentials: a node's broker password and database password are
-- kept in its credential rows only sealed, so that a dump of the database
-- holds none of them. sealed_with says how:
--
--   'login'    the broker password is sealed under the password of the
--              generation's database login, which only its join token
--              (and then the node) holds: generations made by node add and
--              rejoin. The database keeps only the login's SCRAM verifier.
--   'node_key' both passwords are sealed to the node's public key, whose
--              fingerprint is sealed_for: generations made by rotate.
--
-- broker_password is '' and db_password NULL in a sealed row. Rows from
-- before (sealed_with NULL) keep their plain text until the node's next
-- rotation revokes them.
ALTER TABLE node_credentials ADD COLUMN sealed_with text CHECK (sealed_with IN ('login', 'node_key'));
ALTER TABLE node_credentials ADD COLUMN sealed_for text;
ALTER TABLE node_credentials ADD COLUMN sealed_broker_password bytea;
ALTER TABLE node_credentials ADD COLUMN sealed_db_password bytea;
ALTER TABLE node_credentials ADD CONSTRAINT node_credentials_sealed CHECK (
    sealed_with IS NULL
    OR (broker_password = '' AND db_password IS NULL AND sealed_broker_password IS NOT NULL
        AND (sealed_with = 'login' OR (sealed_for IS NOT NULL AND (db_role IS NULL OR sealed_db_password IS NOT NULL))))
);
