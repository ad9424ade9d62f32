-- The recovery kit (internal/seal, kit.go): the mesh's secret of last
-- resort, held by its administrator off the mesh. The database holds its
-- public key and each content key (the mesh's and every scope's) sealed
-- to it, one copy per key, sealed by a node that holds the key. Whoever
-- holds the kit opens them all: `meshbox mesh node add --kit` seals them
-- for a new node when no node that holds them is running.
--
-- mesh_info.mesh_id names the mesh in its kit, so that a kit of another
-- mesh is refused by name.

ALTER TABLE mesh_info ADD COLUMN mesh_id text NOT NULL
    DEFAULT ('mesh-' || substr(md5(random()::text || clock_timestamp()::text), 1, 12));

CREATE TABLE recovery_kit (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    public_key  bytea NOT NULL,
    fingerprint text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One copy per content key, sealed to the kit's public key of fingerprint
-- sealed_for. A kit made anew leaves the copies sealed to the old one
-- stale: its maker deletes them, and nodes seal the keys again.
CREATE TABLE kit_sealed_keys (
    key_id     text PRIMARY KEY REFERENCES content_keys (id) ON DELETE CASCADE,
    sealed_for text NOT NULL,
    sealed     bytea NOT NULL,
    sealed_by  text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- A new kit changes the bindings' revision, so that running nodes seal
-- their keys for it.
CREATE TRIGGER recovery_kit_bump AFTER INSERT OR UPDATE OR DELETE ON recovery_kit
    FOR EACH ROW EXECUTE FUNCTION meshbox_bump_revision();

-- meshbox_kit_public returns the kit's public key (NULL: the mesh has no
-- kit) to the calling node (or the tables' owner).
CREATE FUNCTION meshbox_kit_public(who text) RETURNS bytea
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT k.public_key FROM public.recovery_kit k WHERE public.meshbox_caller_node(who) IS NOT NULL
$$;
GRANT EXECUTE ON FUNCTION meshbox_kit_public(text) TO PUBLIC;

-- meshbox_kit_copies lists which keys have a copy sealed to the kit, and
-- to which kit (no sealed bytes), for the calling node.
CREATE FUNCTION meshbox_kit_copies(who text) RETURNS TABLE (key_id text, sealed_for text)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.key_id, s.sealed_for FROM public.kit_sealed_keys s
     WHERE public.meshbox_caller_node(who) IS NOT NULL ORDER BY 1
$$;
GRANT EXECUTE ON FUNCTION meshbox_kit_copies(text) TO PUBLIC;

-- meshbox_put_kit_key stores a copy of content key kid sealed to the kit
-- by the calling node, which must hold the key itself; fpr must be the
-- fingerprint of the kit's public key now. A copy sealed to that kit
-- already is left alone. It returns whether it wrote.
CREATE FUNCTION meshbox_put_kit_key(kid text, who text, fpr text, blob bytea) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    me text := public.meshbox_caller_node(who);
BEGIN
    IF me IS NULL OR me <> who
       OR NOT EXISTS (SELECT 1 FROM public.sealed_keys s WHERE s.key_id = kid AND s.node = me)
       OR NOT EXISTS (SELECT 1 FROM public.recovery_kit k WHERE k.fingerprint = fpr) THEN
        RETURN false;
    END IF;
    INSERT INTO public.kit_sealed_keys (key_id, sealed_for, sealed, sealed_by) VALUES (kid, fpr, blob, me)
        ON CONFLICT (key_id) DO UPDATE
        SET sealed_for = EXCLUDED.sealed_for, sealed = EXCLUDED.sealed, sealed_by = EXCLUDED.sealed_by, created_at = now()
        WHERE public.kit_sealed_keys.sealed_for IS DISTINCT FROM EXCLUDED.sealed_for;
    RETURN FOUND;
END
$$;
GRANT EXECUTE ON FUNCTION meshbox_put_kit_key(text, text, text, bytea) TO PUBLIC;
