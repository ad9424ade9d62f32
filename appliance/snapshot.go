package appliance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbox/meshbox/appliance/backup"
	"github.com/meshbox/meshbox/internal/wire"
)

// A backup of a running node (`meshbox backup`). The node holds its
// bbolt files (the bindings cache, the outbox, the completed ids, the
// tables' store) locked, so no other process can open them: on a request
// to SubjectBackup the node writes a consistent copy of each (one read
// transaction each, while it keeps working) into SnapshotDir of its data
// directory, and answers where. The command reads them there, with the
// node's other files, seals them into its archive, and removes the
// directory. A requester learns only the directory's name: reading the
// copies takes the rights to read the data directory itself.

// SubjectBackup takes an empty request and answers a BackupReply.
const SubjectBackup = wire.SubjectBackup

// BackupReply answers a request to SubjectBackup.
type BackupReply struct {
	Error string `json:"error,omitempty"`
	// Data is the node's data directory; the copies are in
	// Data/backup.SnapshotDir, under their own names (Files).
	Data    string    `json:"data,omitempty"`
	Files   []string  `json:"files,omitempty"`
	Node    string    `json:"node,omitempty"`
	Mesh    string    `json:"mesh,omitempty"` // "" when the mesh database did not say
	TakenAt time.Time `json:"taken_at"`
}

// snapshots serializes the copies a node writes and counts them.
type snapshots struct {
	mu    sync.Mutex
	count *prometheus.CounterVec
	// restored is the backup the data directory came from; nil: none.
	restored atomic.Pointer[RestoredStatus]
}

func newSnapshots(reg prometheus.Registerer) *snapshots {
	s := &snapshots{count: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshbox_backup_snapshots_total",
		Help: "Copies of the node's files in use written for meshbox backup, by result (ok, error).",
	}, []string{"result"})}
	reg.MustRegister(s.count)
	return s
}

// serveBackup answers SubjectBackup. a.mu is held.
func (a *Appliance) serveBackup() error {
	_, err := a.parts().nc.Subscribe(SubjectBackup, func(m *nats.Msg) {
		if !a.adminRequest(m) {
			return
		}
		rep := a.snapshot()
		data, _ := json.Marshal(rep) // plain values: cannot fail
		a.respond(m, data)
	})
	if err != nil {
		return fmt.Errorf("serve %s: %w", SubjectBackup, err)
	}
	return nil
}

// snapshot writes the copies of the files in use and says where; a
// failure is one log line, the metric, and the reply's error.
func (a *Appliance) snapshot() BackupReply {
	a.snaps.mu.Lock()
	defer a.snaps.mu.Unlock()
	rep, err := a.writeSnapshot()
	if err != nil {
		a.snaps.count.WithLabelValues("error").Inc()
		a.logger.Error("backup: cannot copy the node's files", "err", err)
		return BackupReply{Error: err.Error()}
	}
	a.snaps.count.WithLabelValues("ok").Inc()
	a.logger.Info("backup: copied the node's files in use", "dir", filepath.Join(rep.Data, backup.SnapshotDir), "files", rep.Files)
	return rep
}

func (a *Appliance) writeSnapshot() (BackupReply, error) {
	data, err := filepath.Abs(a.cfg.DataDir)
	if err != nil {
		return BackupReply{}, err
	}
	dir := filepath.Join(data, backup.SnapshotDir)
	if err := os.RemoveAll(dir); err != nil {
		return BackupReply{}, fmt.Errorf("remove the last copy: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return BackupReply{}, err
	}
	rep := BackupReply{Data: data, Node: a.cfg.Node, TakenAt: time.Now().UTC()}
	r := a.parts()
	if bd := r.bindings; bd != nil && bd.store != nil {
		if err := bd.store.CopyTo(filepath.Join(dir, backup.CacheFile)); err != nil {
			return BackupReply{}, err
		}
		rep.Files = append(rep.Files, backup.CacheFile)
		if bd.db != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			rep.Mesh, _ = bd.db.MeshID(ctx) // the archive says it cannot tell when the database does not answer
			cancel()
		}
	}
	if br := r.bridge; br != nil {
		names, err := br.CopyFiles(dir)
		if err != nil {
			return BackupReply{}, err
		}
		rep.Files = append(rep.Files, names...)
	}
	if e := r.rows; e != nil {
		if err := e.CopyTo(filepath.Join(dir, backup.RowsFile)); err != nil {
			return BackupReply{}, err
		}
		rep.Files = append(rep.Files, backup.RowsFile)
	}
	return rep, nil
}

// RestoredStatus says that the node's data directory was restored from a
// backup, and how old the backup was then.
type RestoredStatus struct {
	backup.Restored
	AgeSeconds float64 `json:"backup_age_seconds"`
}

// noteRestored reads whether the data directory was restored from a
// backup, for the status, and says so in the log. a.mu is held.
func (a *Appliance) noteRestored() {
	// A copy a backup left behind (its command stopped before it removed
	// it) is of no use now.
	if err := os.RemoveAll(filepath.Join(a.cfg.DataDir, backup.SnapshotDir)); err != nil {
		a.logger.Warn("cannot remove the copies a backup left in the data directory", "err", err)
	}
	r, ok, err := backup.ReadRestored(a.cfg.DataDir)
	if err != nil {
		a.logger.Warn("cannot read which backup the data directory was restored from", "err", err)
		return
	}
	if !ok {
		return
	}
	st := &RestoredStatus{Restored: r, AgeSeconds: r.Age().Seconds()}
	a.snaps.restored.Store(st)
	a.logger.Info("this node's data directory was restored from a backup: what the node did after the backup was taken is not in it",
		"taken_at", r.TakenAt, "restored_at", r.RestoredAt, "backup_age", r.Age().Round(time.Second).String(), "outbox_marked", r.Marked)
}
