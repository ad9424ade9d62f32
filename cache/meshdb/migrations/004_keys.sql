-- Keys (internal/seal): each node's HPKE public key in its own record,
-- which only the node itself may set; the mesh's content keys by id; and
-- the sealed copies of each content key, one per node, sealed to that
-- node's public key; grant credentials sealed to their consumer. The
-- database holds no key it can use: no private half, content keys and
-- sealed credentials only as sealed copies.

ALTER TABLE nodes ADD COLUMN public_key bytea;

-- The mesh's content keys: ids and lifetimes only, never key bytes. The
-- first one exists from the start; its bytes are made by the first node
-- that claims it (meshbox_claim_key), so they exist only on nodes.
CREATE TABLE content_keys (
    id         text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,31}$'),
    created_at timestamptz NOT NULL DEFAULT now(),
    retire_at  timestamptz -- set by a rotation: after it, nodes forget the key
);
INSERT INTO content_keys (id) VALUES ('k1');

-- One sealed copy per content key and node. sealed_for is the fingerprint
-- (first 16 hex digits of the SHA-256) of the public key it is sealed to:
-- a node whose key changed needs a new copy. opened is set by the node
-- itself once it opens messages with the key: nodes seal with a new key
-- only when every node has.
CREATE TABLE sealed_keys (
    key_id     text NOT NULL REFERENCES content_keys (id) ON DELETE CASCADE,
    node       text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    sealed_for text NOT NULL,
    sealed     bytea NOT NULL,
    sealed_by  text NOT NULL,
    opened     boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key_id, node)
);

-- A grant's credential sealed to its consumer's public key (credential is
-- then empty).
ALTER TABLE grants ADD COLUMN sealed_credential bytea;

-- A node role now writes one column (its public key): the revision bump
-- of its change runs with the owner's rights, as the role may not write
-- mesh_revision itself.
ALTER FUNCTION meshbox_bump_revision() SECURITY DEFINER;
ALTER FUNCTION meshbox_bump_revision() SET search_path = pg_catalog, public, pg_temp;

CREATE TRIGGER content_keys_bump AFTER INSERT OR DELETE ON content_keys
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER content_keys_bump_update AFTER UPDATE ON content_keys
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER content_keys_bump_truncate AFTER TRUNCATE ON content_keys
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER sealed_keys_bump AFTER INSERT OR DELETE ON sealed_keys
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER sealed_keys_bump_update AFTER UPDATE ON sealed_keys
    FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER sealed_keys_bump_truncate AFTER TRUNCATE ON sealed_keys
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();

-- A node role reads its own sealed copies only, every node record, and
-- may set its own public key and nothing else.
ALTER TABLE sealed_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_sealed_keys ON sealed_keys FOR SELECT USING (node = meshbox_node_of(current_user));
ALTER TABLE nodes ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_nodes ON nodes FOR SELECT USING (true);
CREATE POLICY own_public_key ON nodes FOR UPDATE
    USING (name = meshbox_node_of(current_user)) WITH CHECK (name = meshbox_node_of(current_user));

CREATE FUNCTION meshbox_key_fingerprint(pub bytea) RETURNS text
    LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT substr(encode(sha256(pub), 'hex'), 1, 16)
$$;

-- meshbox_key_holders lists who holds a sealed copy of which key, sealed
-- to which public key (no sealed bytes), so that holders can seal a key
-- for the nodes that lack it.
CREATE FUNCTION meshbox_key_holders()
    RETURNS TABLE (key_id text, node text, sealed_for text, opened boolean)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.key_id, s.node, s.sealed_for, s.opened FROM public.sealed_keys s ORDER BY 1, 2
$$;

-- meshbox_caller_node is the node the calling session acts for: the node
-- of its role, or, for the tables' owner (an admin running nodes on its
-- own credential), the node it names.
CREATE FUNCTION meshbox_caller_node(who text) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT COALESCE(public.meshbox_node_of(session_user),
        CASE WHEN pg_has_role(session_user, (SELECT c.relowner FROM pg_class c
                                             WHERE c.oid = 'public.sealed_keys'::regclass), 'MEMBER')
             THEN who END)
$$;

-- meshbox_claim_key stores the first sealed copy of content key kid, for
-- the calling node, when nobody holds the key yet: the caller made its
-- bytes. It returns false when the key is held already (or unknown, or
-- retired, or the copy is not sealed to the caller's public key).
CREATE FUNCTION meshbox_claim_key(kid text, who text, fpr text, blob bytea) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    me text := public.meshbox_caller_node(who);
BEGIN
    IF me IS NULL OR me <> who THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM public.content_keys k WHERE k.id = kid AND k.retire_at IS NULL FOR UPDATE;
    IF NOT FOUND OR EXISTS (SELECT 1 FROM public.sealed_keys s WHERE s.key_id = kid) THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM public.nodes n WHERE n.name = me
                   AND public.meshbox_key_fingerprint(n.public_key) = fpr) THEN
        RETURN false;
    END IF;
    INSERT INTO public.sealed_keys (key_id, node, sealed_for, sealed, sealed_by) VALUES (kid, me, fpr, blob, me);
    RETURN true;
END
$$;

-- meshbox_put_sealed_key stores a copy of content key kid sealed for node
-- target by the calling node, which must hold the key itself; fpr must be
-- the fingerprint of target's public key now. A copy sealed to that key
-- already is left alone. It returns whether it wrote.
CREATE FUNCTION meshbox_put_sealed_key(kid text, who text, target text, fpr text, blob bytea) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    me text := public.meshbox_caller_node(who);
BEGIN
    IF me IS NULL OR me <> who
       OR NOT EXISTS (SELECT 1 FROM public.sealed_keys s WHERE s.key_id = kid AND s.node = me) THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM public.nodes n WHERE n.name = target
                   AND public.meshbox_key_fingerprint(n.public_key) = fpr) THEN
        RETURN false;
    END IF;
    INSERT INTO public.sealed_keys (key_id, node, sealed_for, sealed, sealed_by) VALUES (kid, target, fpr, blob, me)
        ON CONFLICT (key_id, node) DO UPDATE
        SET sealed_for = EXCLUDED.sealed_for, sealed = EXCLUDED.sealed, sealed_by = EXCLUDED.sealed_by,
            opened = false, created_at = now()
        WHERE public.sealed_keys.sealed_for IS DISTINCT FROM EXCLUDED.sealed_for;
    RETURN FOUND;
END
$$;
-- meshbox_key_opened records that the calling node opens messages with
-- content key kid now (its copy sealed to its key of fingerprint fpr).
CREATE FUNCTION meshbox_key_opened(kid text, who text, fpr text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    me text := public.meshbox_caller_node(who);
BEGIN
    IF me IS NULL OR me <> who THEN
        RETURN false;
    END IF;
    UPDATE public.sealed_keys s SET opened = true
     WHERE s.key_id = kid AND s.node = me AND s.sealed_for = fpr AND NOT s.opened;
    RETURN FOUND;
END
$$;

REVOKE ALL ON FUNCTION meshbox_key_holders() FROM PUBLIC;
REVOKE ALL ON FUNCTION meshbox_key_opened(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION meshbox_caller_node(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION meshbox_claim_key(text, text, text, bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION meshbox_put_sealed_key(text, text, text, text, bytea) FROM PUBLIC;

-- Node roles get the new rights too, now and when they are made.
CREATE OR REPLACE FUNCTION meshbox_grant_node(r name) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', r);
    EXECUTE format('GRANT SELECT ON mesh_revision, mesh_info, nodes, settings, assignments, overrides, grants, node_credentials, content_keys, sealed_keys TO %I', r);
    EXECUTE format('GRANT UPDATE (public_key) ON nodes TO %I', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION meshbox_redeem_join_token(text, bytea) TO %I', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION meshbox_key_holders() TO %I', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION meshbox_key_opened(text, text, text) TO %I', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION meshbox_claim_key(text, text, text, bytea) TO %I', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION meshbox_put_sealed_key(text, text, text, text, bytea) TO %I', r);
END
$$;

DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT role FROM node_roles LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r.role) THEN
            PERFORM meshbox_grant_node(r.role::name);
        END IF;
    END LOOP;
END
$$;
