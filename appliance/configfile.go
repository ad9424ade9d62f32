package appliance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshbox/meshbox/internal/suggest"
)

// This file reads the config file: LoadFile, and the errors that say where
// in the file and what to write instead (jsonErrorAt), with the Duration
// type whose decoding errors carry the field's path to them.

// LoadFile reads a JSON config file over c. Unknown keys are an error.
func (c *Config) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var at int64
	if err := c.decodeFile(data, &at); errors.Is(err, errMoreThanOneValue) {
		return fmt.Errorf("config file %s: %w", path, err)
	} else if err != nil {
		return fmt.Errorf("config file %s: %s", path, jsonErrorAt(data, at, err))
	}
	return nil
}

// errMoreThanOneValue is a config file of several JSON values.
var errMoreThanOneValue = errors.New("more than one JSON value")

// jsonErrorAt says where in data a decoding error is: its line, the text
// of that line, and the field's path when the decoder knows it. offset is
// the decoder's position when it stopped; a syntax or type error knows
// its own.
func jsonErrorAt(data []byte, offset int64, err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	msg := strings.TrimPrefix(err.Error(), "json: ")
	line := 0
	switch {
	case errors.As(err, &syn):
		line = lineAt(data, syn.Offset)
		if strings.Contains(msg, "looking for beginning of object key string") {
			msg += " (a comma after the last item before it?)"
		}
	case errors.As(err, &typ) && typ.Type == durationType:
		msg = fmt.Sprintf(`%s: %s is not a duration: write a string such as "5s", "250ms" or "2h"`, typ.Field, typ.Value)
		line = keyLine(data, typ.Field)
	case errors.As(err, &typ):
		msg = fmt.Sprintf("%s: a JSON %s where a %s belongs", typ.Field, typ.Value, typ.Type)
		line = keyLine(data, typ.Field)
	default:
		if k, ok := strings.CutPrefix(msg, "unknown field "); ok {
			name, _ := strconv.Unquote(k)
			guess := "misspelt?"
			if near, ok := suggest.Nearest(name, configKeys()); ok {
				guess = fmt.Sprintf("did you mean %q?", near)
			}
			msg = fmt.Sprintf("unknown key %s (%s the keys are in docs/configuration.md)", k, guess)
			line = keyLine(data, name)
		}
	}
	if line == 0 {
		return msg
	}
	lines := strings.Split(string(data), "\n")
	return fmt.Sprintf("line %d (%s): %s", line, strings.TrimSpace(lines[line-1]), msg)
}

// configKeys are the keys a config file may hold at any depth: the json
// names of the settings and of the parts and policies that hold them.
func configKeys() []string {
	var keys []string
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] {
			return
		}
		seen[t] = true
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || name == "" || !f.IsExported() {
				continue
			}
			if !slices.Contains(keys, name) {
				keys = append(keys, name)
			}
			walk(f.Type)
		}
	}
	walk(formType())
	return keys
}

// lineAt is the line (from 1) of byte offset in data: the last byte the
// decoder read before offset that is not space or a separator.
func lineAt(data []byte, offset int64) int {
	if offset <= 0 || offset > int64(len(data)) {
		return 0
	}
	at := int(offset) - 1
	for at > 0 && strings.ContainsRune(" \t\r\n,", rune(data[at])) {
		at--
	}
	return 1 + bytes.Count(data[:at], []byte("\n"))
}

// keyLine is the line (from 1) of the key a field path ends with
// ("cache.keep": the first "keep" key after the first "cache" key), or 0.
func keyLine(data []byte, path string) int {
	from := 0
	at := -1
	for _, name := range strings.Split(path, ".") {
		re := regexp.MustCompile(`"` + regexp.QuoteMeta(name) + `"\s*:`)
		loc := re.FindIndex(data[from:])
		if loc == nil {
			return 0
		}
		at = from + loc[0]
		from = from + loc[1]
	}
	if at < 0 {
		return 0
	}
	return 1 + bytes.Count(data[:at], []byte("\n"))
}

// Duration is a time.Duration that reads and writes Go's duration strings
// in JSON.
type Duration time.Duration

var durationType = reflect.TypeOf(Duration(0))

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string such as "5s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	// An *UnmarshalTypeError: the decoder adds the field's path to it.
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return &json.UnmarshalTypeError{Value: string(b), Type: durationType}
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return &json.UnmarshalTypeError{Value: strconv.Quote(s), Type: durationType}
	}
	*d = Duration(v)
	return nil
}
