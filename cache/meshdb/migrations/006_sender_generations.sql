-- Sender generations: every node learns which generations of every node's
-- broker credential are valid (the newest, and the older ones until the
-- admin revokes them), so that it accepts a message only from a broker
-- user the mesh database lists (node.<n>.g<gen>), not from any user of
-- that name the broker's operator could make.
--
-- A node role sees only its own node_credentials rows; this function
-- returns the generations of every node, never a user's password, to a
-- caller that may read the node records (node roles, the admin).
CREATE FUNCTION meshbox_node_generations()
    RETURNS TABLE (node text, generation integer)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.node, c.generation FROM public.node_credentials c
    WHERE has_table_privilege(session_user, 'public.nodes', 'SELECT')
    ORDER BY 1, 2
$$;
-- Granted to PUBLIC, as meshbox_credential_switched is: node roles have it
-- whatever later migrations make of meshbox_grant_node, and a role that may
-- not read the nodes gets no row.
GRANT EXECUTE ON FUNCTION meshbox_node_generations() TO PUBLIC;
