-- Key commitments (internal/seal): the node that makes a content key's
-- bytes records, with its claim, a commitment to them in the key's row
-- (seal.ContentKey.Commitment: SHA-256 over a label, the key id and the
-- bytes; it reveals nothing of the key). Every node reads it and uses no
-- opened copy that does not match, so a holder that seals the key for
-- another node can hand it the key or nothing, never other bytes. While
-- any node holds a copy of the key its commitment does not change. Keys
-- claimed before this migration have none: nodes take them as before and
-- say so in their status until a rotation replaces them.

ALTER TABLE content_keys ADD COLUMN commitment bytea
    CHECK (commitment IS NULL OR length(commitment) = 32);

-- A commitment is fixed once a node holds the key (a key nobody holds any
-- more is claimed again with new bytes, and a new commitment).
CREATE FUNCTION meshbox_commitment_fixed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF OLD.commitment IS NOT NULL AND NEW.commitment IS DISTINCT FROM OLD.commitment
       AND EXISTS (SELECT 1 FROM public.sealed_keys s WHERE s.key_id = OLD.id) THEN
        RAISE EXCEPTION 'content key %: its commitment does not change while a node holds the key', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER content_keys_commitment_fixed BEFORE UPDATE ON content_keys
    FOR EACH ROW EXECUTE FUNCTION meshbox_commitment_fixed();

-- meshbox_claim_key, as in migration 005, and it records the key's
-- commitment sum (32 bytes), made by the caller with the key's bytes.
CREATE FUNCTION meshbox_claim_key(kid text, who text, fpr text, blob bytea, sum bytea) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    me text := public.meshbox_caller_node(who);
BEGIN
    IF me IS NULL OR me <> who OR NOT public.meshbox_key_member(kid, me)
       OR sum IS NULL OR length(sum) <> 32 THEN
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
    UPDATE public.content_keys SET commitment = sum WHERE id = kid;
    INSERT INTO public.sealed_keys (key_id, node, sealed_for, sealed, sealed_by) VALUES (kid, me, fpr, blob, me);
    RETURN true;
END
$$;
GRANT EXECUTE ON FUNCTION meshbox_claim_key(text, text, text, bytea, bytea) TO PUBLIC;

-- A claim without a commitment (nodes of older versions) is refused: it
-- would make a key whose copies nobody can check. Those nodes keep
-- opening and sealing the keys that exist; newer nodes make new ones.
CREATE OR REPLACE FUNCTION meshbox_claim_key(kid text, who text, fpr text, blob bytea) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT false
$$;

-- meshbox_drop_sealed_key removes the calling node's own copy of content
-- key kid if its sealed bytes have SHA-256 sum (a copy sealed again since
-- stays): a node drops a copy it refused, and a holder seals the key for
-- it again. who must be the caller's node (or the caller owns the mesh's
-- tables). It returns whether it removed a copy. Granted to PUBLIC, as
-- meshbox_publish_signing_key is: a role that is no node's removes
-- nothing.
CREATE FUNCTION meshbox_drop_sealed_key(kid text, who text, sum bytea) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    me text := public.meshbox_caller_node(who);
BEGIN
    IF me IS NULL OR me <> who THEN
        RETURN false;
    END IF;
    DELETE FROM public.sealed_keys s WHERE s.key_id = kid AND s.node = me AND sha256(s.sealed) = sum;
    RETURN FOUND;
END
$$;
GRANT EXECUTE ON FUNCTION meshbox_drop_sealed_key(text, text, bytea) TO PUBLIC;
