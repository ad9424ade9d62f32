package bridge

import (
	"errors"
	"path/filepath"
)

// CopyFiles writes consistent copies of the bridge's files (the outbox,
// and the completed ids when a stage dedupes) into dir, each under its
// own file name, while the bridge runs: a backup of a running node. It
// returns the names it wrote.
func (b *Bridge) CopyFiles(dir string) ([]string, error) {
	ob := b.files.obRef.Load()
	if ob == nil {
		return nil, errors.New("copy the outbox: the bridge has not opened it")
	}
	var names []string
	name := filepath.Base(b.cfg.OutboxPath)
	if err := ob.CopyTo(filepath.Join(dir, name)); err != nil {
		return names, err
	}
	names = append(names, name)
	if done := b.files.done; done != nil && b.cfg.CompletedPath != "" {
		name := filepath.Base(b.cfg.CompletedPath)
		if err := done.CopyTo(filepath.Join(dir, name)); err != nil {
			return names, err
		}
		names = append(names, name)
	}
	return names, nil
}
