-- Credential rotation: each generation of a node's credential is a broker
-- user and, from the first rotation on, a PostgreSQL login role of its
-- own; the node records when it switched to a generation (connects to the
-- broker and to the database with it), so that the admin revokes the older
-- generations only after that (meshbox mesh node rotate).
--
-- Why a role per generation: PostgreSQL keeps one password per role, and
-- changing it (or letting VALID UNTIL pass) locks out every new
-- connection of the node at once. A new role, with the same rights and
-- mapped to the same node, lets the node connect with the new credential
-- while the old one still works; the old role is dropped after.
--
-- switched_at is set by the node itself, through
-- meshbox_credential_switched, which runs with its owner's rights and
-- touches only the calling role's node's row: node roles keep no write
-- right on any table.

ALTER TABLE node_credentials ADD COLUMN switched_at timestamptz;
-- db_role/db_password: the login role of the generation (NULL for a
-- generation made by node add: its role is the one in the node's join
-- token).
ALTER TABLE node_credentials ADD COLUMN db_role text;
ALTER TABLE node_credentials ADD COLUMN db_password text;

-- A node has a role per generation during a rotation.
ALTER TABLE node_roles DROP CONSTRAINT node_roles_node_key;
CREATE INDEX node_roles_node ON node_roles (node);

-- meshbox_credential_switched records that the node of the calling
-- (session) role now connects with generation gen of its credential: to
-- the broker with its user and, when the generation has a database role,
-- to the database as that role (the calling role must be it). It returns
-- false when the node has no such generation for the calling role.
-- Its search_path holds public because the revision trigger the UPDATE
-- fires names its table unqualified; pg_catalog comes first (nothing can
-- shadow a built-in) and pg_temp last.
CREATE FUNCTION meshbox_credential_switched(gen integer) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    me text := public.meshbox_node_of(session_user);
BEGIN
    IF me IS NULL THEN
        RETURN false;
    END IF;
    UPDATE public.node_credentials c SET switched_at = now()
        WHERE c.node = me AND c.generation = gen AND c.switched_at IS NULL
          AND (c.db_role IS NULL OR c.db_role = session_user::text);
    RETURN EXISTS (SELECT 1 FROM public.node_credentials c WHERE c.node = me AND c.generation = gen
        AND (c.db_role IS NULL OR c.db_role = session_user::text));
END
$$;
-- Every role may call it: it changes nothing for a role that is not a
-- node's (meshbox_node_of is NULL) and only the calling node's own row
-- otherwise. Granted to PUBLIC rather than through meshbox_grant_node, so
-- that node roles have it whatever later migrations make of that function.
GRANT EXECUTE ON FUNCTION meshbox_credential_switched(integer) TO PUBLIC;
