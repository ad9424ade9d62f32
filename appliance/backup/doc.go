// Package backup is the archive of a node's backup: `meshbox backup`
// writes one, `meshbox restore` makes a data directory from one.
//
// # The archive
//
// An archive is a tar file. Its entries are the node's files, each sealed,
// under files/<path> (path relative to the data directory), and last a
// manifest (manifest.json, in the clear) that records the format, the
// mesh and the node, when the backup was taken, and for each file its
// size, mode, and the SHA-256 of its contents and of its sealed entry.
// Writer writes it to a temporary file beside its destination and renames
// it into place (mode 0600), so a backup that fails leaves no archive.
//
// # Sealing
//
// Every file is sealed, not only the secrets (node.key, signing.key, the
// programs' credentials, the broker password in the bindings cache), for
// the outbox and the tables hold what programs wrote. A random data key
// seals each file in chunks of ChunkSize with AES-256-GCM, each chunk's
// associated data naming the archive, the file, the chunk's index and
// whether it is the last (so chunks cannot be reordered, moved between
// files or cut off). The data key itself is sealed either to the mesh's
// recovery kit (HPKE, internal/seal) or under a key derived from a
// passphrase (Argon2id, golang.org/x/crypto/argon2, then AES-256-GCM),
// with the manifest's header (format, archive id, mesh, node, time) as
// associated data: a manifest altered there opens nothing.
//
// # Checks
//
// Open reads an archive without a key and checks what needs none: the
// manifest, its format, and every entry against the SHA-256 the manifest
// records (ErrDamaged). Archive.Unseal then opens the data key
// (ErrWrongKey when the kit or passphrase is not the one it was sealed
// with) and Archive.Extract writes the files into a directory, checking
// each file's SHA-256 as it goes.
package backup
