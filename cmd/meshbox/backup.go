package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/appliance"
	"github.com/meshbox/meshbox/appliance/backup"
	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/boltfile"
)

// BackupCommand writes a backup of a node (package appliance/backup): of
// the running node, which copies the files it holds open itself
// (appliance.SubjectBackup), or of a stopped one, whose files it opens.
type BackupCommand struct{ m *Main }

// boltFiles are the data directory's bbolt files: never read as they are
// while a node may write them, but copied in a read transaction.
var boltFiles = []string{backup.CacheFile, backup.OutboxFile, backup.CompletedFile, backup.RowsFile}

// skipDirs are the parts of a data directory a backup leaves out: what
// the node makes again (modules fetched from the forge, its run
// directory), a copy in progress, and the blob store unless --blobs.
var skipDirs = []string{"modules", "run", backup.SnapshotDir}

// blobsDir is the blob store's directory (the embedded NATS server's
// JetStream).
const blobsDir = "jetstream"

// backupKeyFlags are the flags that say what seals or opens an archive.
type backupKeyFlags struct{ kit, pass *string }

func (m *Main) backupKeyFlags(fs *flag.FlagSet, verb string) backupKeyFlags {
	return backupKeyFlags{
		kit:  m.envFlag(fs, "kit", "MESHBOX_KIT", "the mesh's recovery kit file: "+verb+" the archive with it (env MESHBOX_KIT)"),
		pass: fs.String("passphrase-file", "", "a file whose first line is a passphrase (at least 12 characters): "+verb+" the archive with it"),
	}
}

// key reads the kit or the passphrase; exactly one is wanted.
func (f backupKeyFlags) key(cmd string) (backup.Key, error) {
	switch {
	case *f.kit != "" && *f.pass != "":
		return backup.Key{}, usagef("%s: --kit and --passphrase-file: give one", cmd)
	case *f.kit == "" && *f.pass == "":
		return backup.Key{}, usagef("%s: the node's keys are sealed in the archive: give --kit FILE (the mesh's recovery kit) or --passphrase-file FILE", cmd)
	case *f.kit != "":
		kit, err := readKit(*f.kit)
		if err != nil {
			return backup.Key{}, err
		}
		return backup.KitKey(kit), nil
	}
	raw, err := os.ReadFile(*f.pass)
	if err != nil {
		return backup.Key{}, fmt.Errorf("%s: passphrase file: %w", cmd, err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	k, err := backup.PassphraseKey([]byte(strings.TrimSuffix(line, "\r")))
	if err != nil {
		return backup.Key{}, fmt.Errorf("%s: passphrase file %s: %w", cmd, *f.pass, err)
	}
	return k, nil
}

// flags defines backup's flags; its action writes the archive.
func (c *BackupCommand) flags(fs *flag.FlagSet) action {
	server := c.m.serverFlag(fs)
	out := fs.String("out", "", "write the archive to FILE (required; never over an existing file)")
	blobs := fs.Bool("blobs", false, "include the node's blob store")
	keys := c.m.backupKeyFlags(fs, "seal")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return usagef("backup takes no arguments (got %q); the archive goes to --out FILE", args[0])
		}
		if *out == "" {
			return usagef("backup: --out FILE is required: where the archive goes")
		}
		key, err := keys.key("backup")
		if err != nil {
			return err
		}
		return c.run(ctx, *server, *out, *blobs, key)
	}
}

// snapshot is the copies of the files in use, and what the node said.
type snapshot struct {
	data, dir  string
	files      []string // in dir
	node, mesh string
	at         time.Time
	live       bool
}

func (c *BackupCommand) run(ctx context.Context, server, out string, blobs bool, key backup.Key) error {
	snap, err := c.takeSnapshot(ctx, server)
	if err != nil {
		return err
	}
	defer os.RemoveAll(snap.dir)
	if abs, err := filepath.Abs(out); err == nil && strings.HasPrefix(abs, snap.data+string(filepath.Separator)) {
		return usagef("backup: --out %s is inside the node's data directory %s: write the archive elsewhere", out, snap.data)
	}
	if kit := key.Mesh(); kit != "" {
		if snap.mesh != "" && kit != snap.mesh {
			return fmt.Errorf("backup: %s is not this node's mesh (%s): give that mesh's kit (nothing was written)", key, snap.mesh)
		}
		snap.mesh = kit
	}
	w, err := backup.Create(out, backup.Manifest{Node: snap.node, Mesh: snap.mesh, TakenAt: snap.at,
		Version: appliance.Build().Version, Live: snap.live, Blobs: blobs}, key)
	if err != nil {
		return err
	}
	defer w.Abort()
	for _, name := range snap.files {
		if err := w.AddFile(name, filepath.Join(snap.dir, name)); err != nil {
			return err
		}
	}
	if err := c.addFiles(w, snap, blobs); err != nil {
		return err
	}
	if env := c.m.client.envPath; env != "" {
		if err := w.AddFile(backup.EnvFile, env); err != nil {
			return fmt.Errorf("backup: the node's configuration %s: %w", env, err)
		}
	}
	man := w.Manifest()
	if err := w.Commit(); err != nil {
		return err
	}
	var bytes int64
	for _, f := range man.Files {
		bytes += f.Size
	}
	how := "the stopped node's files"
	if snap.live {
		how = "the running node"
	}
	mesh := snap.mesh
	if mesh == "" {
		mesh = "not known: a standalone node, or the mesh database did not answer; --kit records it"
	}
	fmt.Fprintf(c.m.Stdout, "backup of node %s (mesh %s) written to %s (mode 0600): %d files, %d bytes, taken %s from %s, sealed with %s\n",
		snap.node, mesh, out, len(man.Files), bytes, snap.at.Format(time.RFC3339), how, key)
	return nil
}

// takeSnapshot has the running node copy its files in use; when no node
// answers, it copies them itself, which the files' locks allow only while
// no node runs.
func (c *BackupCommand) takeSnapshot(ctx context.Context, server string) (snapshot, error) {
	cfg, err := c.m.nodeConfig()
	if err != nil {
		return snapshot{}, err
	}
	data, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return snapshot{}, err
	}
	nc, connErr := c.m.connectNode(server)
	if connErr == nil {
		defer nc.Close()
		return c.liveSnapshot(ctx, nc, data)
	}
	snap := snapshot{data: data, node: cfg.Node, at: time.Now().UTC()}
	if _, err := os.Stat(data); err != nil {
		return snap, fmt.Errorf("backup: the node's data directory: %w (give --data DIR)", err)
	}
	// Outside the data directory: a copy left there by a command run as
	// root would keep the node's user from starting it.
	if snap.dir, err = os.MkdirTemp("", "meshbox-backup-*"); err != nil {
		return snap, fmt.Errorf("backup: %w", err)
	}
	for _, name := range boltFiles {
		path := filepath.Join(data, name)
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		db, err := boltfile.Open(path, boltfile.Options{ReadOnly: true, LockTimeout: 500 * time.Millisecond})
		if err != nil {
			os.RemoveAll(snap.dir)
			var locked *boltfile.LockedError
			if errors.As(err, &locked) {
				return snap, fmt.Errorf("backup: the node runs (it holds %s) but does not answer: %v; say how to reach it: --server URL, --creds FILE", path, connErr)
			}
			return snap, fmt.Errorf("backup: %w", err)
		}
		err = boltfile.Copy(db, filepath.Join(snap.dir, name))
		db.Close()
		if err != nil {
			os.RemoveAll(snap.dir)
			return snap, fmt.Errorf("backup: %w", err)
		}
		snap.files = append(snap.files, name)
	}
	// The node the cache was kept for, rather than a name the
	// configuration may leave to the host's.
	if st, err := cache.Open(filepath.Join(snap.dir, backup.CacheFile), cache.StoreOptions{ReadOnly: true}); err == nil {
		if s, err := st.Latest(); err == nil && s.Bindings.Node != "" {
			snap.node = s.Bindings.Node
		}
		st.Close()
	}
	return snap, nil
}

// liveSnapshot asks the running node for copies of its files in use.
func (c *BackupCommand) liveSnapshot(ctx context.Context, nc *nats.Conn, data string) (snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, appliance.SubjectBackup, nil)
	if err != nil {
		return snapshot{}, fmt.Errorf("backup: the node did not answer %s: %v (a meshbox older than this one cannot be backed up while it runs: stop it first)", appliance.SubjectBackup, err)
	}
	var rep appliance.BackupReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return snapshot{}, fmt.Errorf("backup: the node's answer is not valid JSON: %v", err)
	}
	if rep.Error != "" {
		return snapshot{}, fmt.Errorf("backup: the node could not copy its files: %s (its log says more)", rep.Error)
	}
	// The files are read where this command's configuration has them,
	// never where an answer says: the copies must be that directory's.
	if !sameDir(data, rep.Data) {
		return snapshot{}, fmt.Errorf("backup: the node that answered keeps its data in %s, and its configuration here says %s: give --data DIR of that node, or --server of the node whose data is in %s (nothing was written)",
			rep.Data, data, data)
	}
	return snapshot{data: data, dir: filepath.Join(data, backup.SnapshotDir), files: rep.Files,
		node: rep.Node, mesh: rep.Mesh, at: rep.TakenAt, live: true}, nil
}

// addFiles adds the data directory's other files: those no node holds
// open, read as they are.
func (c *BackupCommand) addFiles(w *backup.Writer, snap snapshot, blobs bool) error {
	copied := map[string]bool{}
	for _, f := range snap.files {
		copied[f] = true
	}
	return filepath.WalkDir(snap.data, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // gone meanwhile
			}
			return fmt.Errorf("backup: %w (run as the node's user, or as root)", err)
		}
		rel, _ := filepath.Rel(snap.data, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			for _, s := range skipDirs {
				if rel == s {
					return filepath.SkipDir
				}
			}
			if rel == blobsDir && !blobs {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case !d.Type().IsRegular(), rel == backup.RestoredFile, strings.Contains(rel, ".corrupt-"):
			return nil
		case !strings.Contains(rel, "/") && isBoltFile(rel):
			if copied[rel] {
				return nil // its copy is in
			}
			if snap.live {
				// A file the running node does not hold open (the completed
				// ids of a node whose stages no longer dedupe): quiet.
				break
			}
			return nil // taken above, unless it did not exist
		}
		if err := w.AddFile(rel, path); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while the backup ran (a blob store's block)
			}
			return err
		}
		return nil
	})
}

func isBoltFile(name string) bool {
	for _, b := range boltFiles {
		if name == b {
			return true
		}
	}
	return false
}

// sameDir reports whether a and b name one directory.
func sameDir(a, b string) bool {
	if a == b {
		return true
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}
