package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/meshbox/meshbox/cache"
)

// Helpers of the mesh commands: reading a credential file, and writing
// tables, JSON and clipped text.

// readCredential reads a grant's credential from a file or standard input,
// without a trailing newline.
func (c *MeshCommand) readCredential(path string) (string, error) {
	var data []byte
	var err error
	switch path {
	case "":
		return "", nil
	case "-":
		data, err = io.ReadAll(io.LimitReader(c.m.Stdin, cache.MaxValueLen+1))
	default:
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return "", fmt.Errorf("read credential: %w", err)
	}
	if len(data) > cache.MaxValueLen {
		return "", errors.New("read credential: longer than 64 KiB")
	}
	return strings.TrimRight(string(data), "\r\n"), nil
}

// writeTable prints rows as aligned columns; the first row is the header.
func writeTable(w io.Writer, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// clip shortens s for a table cell and keeps it on one line.
func clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", `\n`)
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// given reports whether flag name was set on the command line of fs.
func given(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
