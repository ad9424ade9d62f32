// Package meshdb is the mesh database: the PostgreSQL schema that holds a
// mesh's bindings, its migrations (embedded, applied with tern), loading a
// node's bindings, following changes with LISTEN/NOTIFY, and the
// administrative operations behind `meshbox init` and `meshbox mesh`.
//
// Every change to a binding table bumps the single mesh revision, once per
// transaction, and sends NOTIFY meshbox_bindings with the new revision; SQL
// triggers do both, so every writer (these operations, psql, another tool)
// is covered. Each administrative operation runs in one transaction and
// validates its input before touching the database: bad input changes
// nothing.
//
// DB is safe for concurrent use. Connections, statements and lock waits
// are bounded (Options): pgx's own defaults would wait for minutes.
// Watch owns one dedicated connection for LISTEN while it runs.
package meshdb
