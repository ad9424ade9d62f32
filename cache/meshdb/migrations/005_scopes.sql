-- Scopes (internal/seal): smaller trust boundaries inside a mesh. A scope
-- has content keys of its own (content_keys.scope), names the nodes that
-- hold them (scope_members), and binds capabilities, stages and event
-- topics to itself (scope_bindings): traffic of a bound name is sealed
-- with the scope's key, which only its members receive. The functions
-- that store sealed copies of keys (migration 004) seal a scope's key only
-- for its members, and only by its members.

CREATE TABLE scopes (
    name       text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_-]{1,64}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE scope_members (
    scope text NOT NULL REFERENCES scopes (name) ON DELETE CASCADE,
    node  text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    PRIMARY KEY (scope, node)
);

-- A name is bound to one scope at most.
CREATE TABLE scope_bindings (
    scope text NOT NULL REFERENCES scopes (name) ON DELETE CASCADE,
    kind  text NOT NULL CHECK (kind IN ('cap', 'stage', 'topic')),
    name  text NOT NULL CHECK (name ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' AND length(name) <= 128),
    PRIMARY KEY (kind, name)
);

-- NULL: a key of the mesh; else a key of the scope.
ALTER TABLE content_keys ADD COLUMN scope text REFERENCES scopes (name) ON DELETE CASCADE;

CREATE TRIGGER scopes_bump AFTER INSERT OR UPDATE OR DELETE ON scopes
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER scopes_bump_truncate AFTER TRUNCATE ON scopes
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER scope_members_bump AFTER INSERT OR UPDATE OR DELETE ON scope_members
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER scope_members_bump_truncate AFTER TRUNCATE ON scope_members
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER scope_bindings_bump AFTER INSERT OR UPDATE OR DELETE ON scope_bindings
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();
CREATE TRIGGER scope_bindings_bump_truncate AFTER TRUNCATE ON scope_bindings
    FOR EACH STATEMENT EXECUTE FUNCTION meshbox_bump_revision();

-- A node that leaves a scope loses its sealed copies of the scope's keys
-- (rotate the scope so that it cannot open what comes next either).
CREATE FUNCTION meshbox_scope_member_left() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM public.sealed_keys s USING public.content_keys k
     WHERE s.key_id = k.id AND k.scope = OLD.scope AND s.node = OLD.node;
    RETURN OLD;
END
$$;
CREATE TRIGGER scope_members_left AFTER DELETE ON scope_members
    FOR EACH ROW EXECUTE FUNCTION meshbox_scope_member_left();

-- meshbox_key_member reports whether node may hold content key kid: every
-- node may hold the mesh's keys, only a scope's members its keys.
CREATE FUNCTION meshbox_key_member(kid text, node text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM public.content_keys k WHERE k.id = kid AND (k.scope IS NULL
        OR EXISTS (SELECT 1 FROM public.scope_members m WHERE m.scope = k.scope AND m.node = meshbox_key_member.node)))
$$;

-- As in migration 004, and a scope's key only by and for its members.
CREATE OR REPLACE FUNCTION meshbox_claim_key(kid text, who text, fpr text, blob bytea) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    me text := public.meshbox_caller_node(who);
BEGIN
    IF me IS NULL OR me <> who OR NOT public.meshbox_key_member(kid, me) THEN
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

CREATE OR REPLACE FUNCTION meshbox_put_sealed_key(kid text, who text, target text, fpr text, blob bytea) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    me text := public.meshbox_caller_node(who);
BEGIN
    IF me IS NULL OR me <> who
       OR NOT EXISTS (SELECT 1 FROM public.sealed_keys s WHERE s.key_id = kid AND s.node = me)
       OR NOT public.meshbox_key_member(kid, me) OR NOT public.meshbox_key_member(kid, target) THEN
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

REVOKE ALL ON FUNCTION meshbox_key_member(text, text) FROM PUBLIC;

-- Node roles read the scopes (names and members: no secret), now and when
-- they are made.
CREATE OR REPLACE FUNCTION meshbox_grant_node(r name) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', r);
    EXECUTE format('GRANT SELECT ON mesh_revision, mesh_info, nodes, settings, assignments, overrides, grants, node_credentials, content_keys, sealed_keys, scopes, scope_members, scope_bindings TO %I', r);
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
