-- Node identity: one PostgreSQL role per node, row-level security so that a
-- node role reads every node record and setting but only its own
-- assignments, overrides, grants and credentials; each node's broker
-- credential in its own rows; join tokens (only a hash of their secret).
--
-- Roles are cluster-wide, so a node's role name is not its node name: it is
-- meshbox_node_<node, cut to 40 bytes>_<8 random hex digits> (at most 62
-- bytes, PostgreSQL's limit is 63), mapped to the node by node_roles. The
-- owner of these tables (the admin who ran the migrations) and superusers
-- are not subject to the policies.

-- stages: the stages the node may consume on the broker ('*' = every one).
ALTER TABLE nodes ADD COLUMN stages text[] NOT NULL DEFAULT '{*}';

CREATE TABLE node_roles (
    role text PRIMARY KEY CHECK (role ~ '^meshbox_node_[A-Za-z0-9_-]{1,40}_[0-9a-f]{8}$'),
    node text NOT NULL UNIQUE REFERENCES nodes (name) ON DELETE CASCADE
);

-- One row per generation of a node's broker credential; during a rotation
-- a node has two. The database role's password is the role's own.
CREATE TABLE node_credentials (
    node            text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    generation      integer NOT NULL CHECK (generation >= 1),
    broker_user     text NOT NULL,
    broker_password text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node, generation)
);

CREATE TRIGGER node_credentials_bump AFTER INSERT OR DELETE ON node_credentials
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER node_credentials_bump_update AFTER UPDATE ON node_credentials
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER node_credentials_bump_truncate AFTER TRUNCATE ON node_credentials
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();

-- Join tokens: one use, expiring; the secret is kept only as its SHA-256.
-- No node role can read this table; redeeming goes through
-- meshbox_redeem_join_token.
CREATE TABLE join_tokens (
    id            text PRIMARY KEY,
    node          text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    secret_sha256 bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    used_at       timestamptz
);

-- meshbox_node_of returns the node a role belongs to, or NULL. It runs with
-- its owner's rights, so node roles need no access to node_roles.
CREATE FUNCTION meshbox_node_of(r name) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT node FROM public.node_roles WHERE role = r::text
$$;

ALTER TABLE assignments ENABLE ROW LEVEL SECURITY;
ALTER TABLE overrides ENABLE ROW LEVEL SECURITY;
ALTER TABLE grants ENABLE ROW LEVEL SECURITY;
ALTER TABLE node_credentials ENABLE ROW LEVEL SECURITY;

CREATE POLICY own_assignments ON assignments FOR SELECT USING (node = meshbox_node_of(current_user));
CREATE POLICY own_overrides ON overrides FOR SELECT USING (node = meshbox_node_of(current_user));
CREATE POLICY own_grants ON grants FOR SELECT USING (consumer = meshbox_node_of(current_user));
CREATE POLICY own_credentials ON node_credentials FOR SELECT USING (node = meshbox_node_of(current_user));

-- meshbox_redeem_join_token redeems a join token for the node of the
-- calling (session) role: it checks the secret, that the token is unused
-- and not expired, and marks it used, in one transaction. outcome is 'ok',
-- 'unknown' (no such token for this node, or a wrong secret), 'used' (at =
-- when) or 'expired' (at = when).
CREATE FUNCTION meshbox_redeem_join_token(token_id text, secret bytea)
    RETURNS TABLE (outcome text, node text, at timestamptz)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t public.join_tokens%ROWTYPE;
    me text := public.meshbox_node_of(session_user);
BEGIN
    SELECT * INTO t FROM public.join_tokens j WHERE j.id = token_id FOR UPDATE;
    IF NOT FOUND OR me IS NULL OR t.node <> me OR t.secret_sha256 <> sha256(secret) THEN
        RETURN QUERY SELECT 'unknown'::text, me, NULL::timestamptz;
    ELSIF t.used_at IS NOT NULL THEN
        RETURN QUERY SELECT 'used'::text, t.node, t.used_at;
    ELSIF t.expires_at <= now() THEN
        RETURN QUERY SELECT 'expired'::text, t.node, t.expires_at;
    ELSE
        UPDATE public.join_tokens j SET used_at = now() WHERE j.id = token_id;
        RETURN QUERY SELECT 'ok'::text, t.node, now();
    END IF;
END
$$;
REVOKE ALL ON FUNCTION meshbox_redeem_join_token(text, bytea) FROM PUBLIC;

-- meshbox_grant_node gives a node role what it may read. Policies above
-- filter the rows; nothing else is granted (no writes, no join tokens, no
-- role map).
CREATE FUNCTION meshbox_grant_node(r name) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', r);
    EXECUTE format('GRANT SELECT ON mesh_revision, mesh_info, nodes, settings, assignments, overrides, grants, node_credentials TO %I', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION meshbox_redeem_join_token(text, bytea) TO %I', r);
END
$$;
