-- Signing keys (internal/seal, package node): each node's Ed25519 public
-- key in its own record, which only the node itself sets. Its peers accept
-- its discovery messages only signed with it once it is set.
ALTER TABLE nodes ADD COLUMN signing_key bytea
    CHECK (signing_key IS NULL OR length(signing_key) = 32);

-- meshbox_publish_signing_key sets the calling node's signing key (who
-- must be the node of the caller's role, or the caller owns the mesh's
-- tables). It returns false when who is not the caller's node or has no
-- record. Granted to PUBLIC, as meshbox_node_generations is: node roles
-- have it whatever later migrations make of meshbox_grant_node, and a
-- role that is no node's sets nothing.
CREATE FUNCTION meshbox_publish_signing_key(who text, pub bytea) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    me text := public.meshbox_caller_node(who);
BEGIN
    IF me IS NULL OR me <> who THEN
        RETURN false;
    END IF;
    UPDATE public.nodes SET signing_key = pub WHERE name = me AND signing_key IS DISTINCT FROM pub;
    RETURN EXISTS (SELECT 1 FROM public.nodes n WHERE n.name = me);
END
$$;
GRANT EXECUTE ON FUNCTION meshbox_publish_signing_key(text, bytea) TO PUBLIC;
