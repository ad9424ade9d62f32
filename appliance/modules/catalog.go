package modules

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Catalog is the node's module catalog as read at one moment: one entry
// per folder of the catalog directory. A bad manifest makes only its own
// entry unusable.
type Catalog struct {
	Dir     string
	Entries map[string]Entry
	// Err is why the directory itself could not be read (nil when it does
	// not exist: an empty catalog).
	Err error
}

// Entry is one module of the catalog: its manifest, or why it has none.
type Entry struct {
	Dir      string    // the module's folder
	Manifest *Manifest // nil when Err is set
	Err      error     // a *ManifestError
}

// LoadCatalog reads every <dir>/<module>/manifest.json. A missing
// directory is an empty catalog.
func LoadCatalog(dir string) Catalog {
	c := Catalog{Dir: dir, Entries: map[string]Entry{}}
	list, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			c.Err = fmt.Errorf("module catalog %s: %w", dir, err)
		}
		return c
	}
	for _, de := range list {
		name := de.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		mdir := filepath.Join(dir, name)
		if fi, err := os.Stat(mdir); err != nil || !fi.IsDir() {
			continue // a file beside the folders, e.g. a README
		}
		m, err := ReadManifest(filepath.Join(mdir, ManifestFile), name)
		c.Entries[name] = Entry{Dir: mdir, Manifest: m, Err: err}
	}
	return c
}

// resolveCommand returns the program a selection runs: a path with a '/'
// is taken relative to the module's folder; a bare name is looked up in
// path (a PATH list).
func (e Entry) resolveCommand(selection, path string) (string, error) {
	sel := e.Manifest.Selections[selection]
	field := "selections." + selection + ".command"
	file := filepath.Join(e.Dir, ManifestFile)
	var prog string
	if strings.Contains(sel.Command, "/") {
		prog = sel.Command
		if !filepath.IsAbs(prog) {
			prog = filepath.Join(e.Dir, prog)
		}
	} else {
		for _, d := range filepath.SplitList(path) {
			if d == "" || !filepath.IsAbs(d) {
				continue // never a relative PATH entry
			}
			if executable(filepath.Join(d, sel.Command)) == nil {
				return filepath.Join(d, sel.Command), nil
			}
		}
		return "", &ManifestError{File: file, Field: field, Err: fmt.Errorf("%q: %w", sel.Command, exec.ErrNotFound)}
	}
	if err := executable(prog); err != nil {
		return "", &ManifestError{File: file, Field: field, Err: err}
	}
	return prog, nil
}

// executable reports why path is not a program file, or nil.
func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s is a directory", path)
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not executable", path)
	}
	return nil
}

// workDir is the selection's working directory.
func (e Entry) workDir(selection string) string {
	if d := e.Manifest.Selections[selection].Dir; d != "" {
		return filepath.Join(e.Dir, d)
	}
	return e.Dir
}
