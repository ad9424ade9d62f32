-- Key events and compromise response (cache/meshdb/keyevents.go).
--
-- content_keys.compromised marks a key that a node removed as compromised
-- held: no node seals with it any more; members still open what was sealed
-- with it until it retires (the rotation that marked it set retire_at).
--
-- key_events is the history of the mesh's keys, one row an event, written
-- by triggers on the tables that change (so every way in records the same
-- events): a key made (its first copy, claimed by the node that made its
-- bytes), sealed for a node or for the recovery kit, rotated (a key added
-- beside older ones), retired (deleted after its retire_at; a key still
-- listed whose retire_at passed is shown as retired by the listing),
-- recovered (sealed for a node with the recovery kit) or revoked (a
-- node's copy withdrawn: the node was removed or left the scope). Rows
-- name keys and nodes by name, without references, so that they outlive
-- both. A transaction may say why in the setting meshbox.key_event_reason
-- (SET LOCAL), which its events carry as their detail.

ALTER TABLE content_keys ADD COLUMN compromised boolean NOT NULL DEFAULT false;

CREATE TABLE key_events (
    id      bigserial PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    kind    text NOT NULL CHECK (kind IN ('made', 'sealed', 'rotated', 'retired', 'recovered', 'revoked')),
    key_id  text,          -- NULL: an event of a node (its removal) rather than of one key
    scope   text,          -- NULL: the mesh's key
    holder  text,          -- the node (or 'recovery-kit') that holds or held the copy
    by_whom text NOT NULL, -- the node or database role that did it
    detail  text NOT NULL DEFAULT ''
);
CREATE INDEX key_events_at ON key_events (at, id);

-- meshbox_key_event_reason is the reason the current transaction gave
-- (SET LOCAL meshbox.key_event_reason), or ''.
CREATE FUNCTION meshbox_key_event_reason() RETURNS text
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT COALESCE(current_setting('meshbox.key_event_reason', true), '')
$$;

-- meshbox_key_event_detail joins what happened and the transaction's
-- reason.
CREATE FUNCTION meshbox_key_event_detail(what text) RETURNS text
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN public.meshbox_key_event_reason() = '' THEN what
                WHEN what = '' THEN public.meshbox_key_event_reason()
                ELSE what || '; ' || public.meshbox_key_event_reason() END
$$;

CREATE FUNCTION meshbox_key_events_content() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    older text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT string_agg(k.id, ',' ORDER BY k.created_at, k.id) INTO older FROM public.content_keys k
         WHERE k.id <> NEW.id AND k.scope IS NOT DISTINCT FROM NEW.scope
           AND (k.retire_at IS NULL OR k.retire_at > now());
        IF older IS NOT NULL THEN
            INSERT INTO public.key_events (kind, key_id, scope, by_whom, detail)
            VALUES ('rotated', NEW.id, NEW.scope, session_user,
                    public.meshbox_key_event_detail('replaces ' || older));
        END IF;
        RETURN NEW;
    END IF;
    -- DELETE
    IF OLD.retire_at IS NOT NULL AND OLD.retire_at <= now() THEN
        INSERT INTO public.key_events (at, kind, key_id, scope, by_whom, detail)
        VALUES (OLD.retire_at, 'retired', OLD.id, OLD.scope, session_user, 'its retention ended');
    ELSE
        INSERT INTO public.key_events (kind, key_id, scope, by_whom, detail)
        VALUES ('revoked', OLD.id, OLD.scope, session_user, public.meshbox_key_event_detail('the key was deleted (its scope was removed)'));
    END IF;
    RETURN OLD;
END
$$;
CREATE TRIGGER content_keys_events AFTER INSERT OR DELETE ON content_keys
    FOR EACH ROW EXECUTE FUNCTION meshbox_key_events_content();

CREATE FUNCTION meshbox_key_events_sealed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sc text;
BEGIN
    IF TG_OP = 'INSERT' OR TG_OP = 'UPDATE' THEN
        IF TG_OP = 'UPDATE' AND NEW.sealed_for IS NOT DISTINCT FROM OLD.sealed_for THEN
            RETURN NEW; -- opened, or the same copy
        END IF;
        SELECT k.scope INTO sc FROM public.content_keys k WHERE k.id = NEW.key_id;
        INSERT INTO public.key_events (kind, key_id, scope, holder, by_whom, detail)
        VALUES (CASE WHEN NEW.sealed_by = 'recovery-kit' THEN 'recovered'
                     WHEN NEW.sealed_by = NEW.node THEN 'made'
                     ELSE 'sealed' END,
                NEW.key_id, sc, NEW.node, NEW.sealed_by,
                CASE WHEN TG_OP = 'UPDATE' THEN 'sealed again: the node has a new public key' ELSE '' END);
        RETURN NEW;
    END IF;
    -- DELETE: a copy withdrawn. A key deleted takes its copies along
    -- (its own event says so); a copy the node refused is sealed again.
    SELECT k.scope INTO sc FROM public.content_keys k WHERE k.id = OLD.key_id;
    IF NOT FOUND THEN
        RETURN OLD;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM public.nodes n WHERE n.name = OLD.node) THEN
        INSERT INTO public.key_events (kind, key_id, scope, holder, by_whom, detail)
        VALUES ('revoked', OLD.key_id, sc, OLD.node, session_user,
                COALESCE(NULLIF(public.meshbox_key_event_reason(), ''), 'the node was removed'));
    ELSIF sc IS NOT NULL AND NOT EXISTS (SELECT 1 FROM public.scope_members m WHERE m.scope = sc AND m.node = OLD.node) THEN
        INSERT INTO public.key_events (kind, key_id, scope, holder, by_whom, detail)
        VALUES ('revoked', OLD.key_id, sc, OLD.node, session_user, public.meshbox_key_event_detail('the node left the scope'));
    END IF;
    RETURN OLD;
END
$$;
CREATE TRIGGER sealed_keys_events AFTER INSERT OR UPDATE OR DELETE ON sealed_keys
    FOR EACH ROW EXECUTE FUNCTION meshbox_key_events_sealed();

CREATE FUNCTION meshbox_key_events_kit() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sc text;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.sealed_for IS NOT DISTINCT FROM OLD.sealed_for THEN
        RETURN NEW;
    END IF;
    SELECT k.scope INTO sc FROM public.content_keys k WHERE k.id = NEW.key_id;
    INSERT INTO public.key_events (kind, key_id, scope, holder, by_whom, detail)
    VALUES ('sealed', NEW.key_id, sc, 'recovery-kit', NEW.sealed_by, 'for the recovery kit ' || NEW.sealed_for);
    RETURN NEW;
END
$$;
CREATE TRIGGER kit_sealed_keys_events AFTER INSERT OR UPDATE ON kit_sealed_keys
    FOR EACH ROW EXECUTE FUNCTION meshbox_key_events_kit();

REVOKE ALL ON FUNCTION meshbox_key_events_content() FROM PUBLIC;
REVOKE ALL ON FUNCTION meshbox_key_events_sealed() FROM PUBLIC;
REVOKE ALL ON FUNCTION meshbox_key_events_kit() FROM PUBLIC;
