package programs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		p    Program
		want string // "" valid, else a piece of the error
	}{
		{"minimal", Program{Name: "p"}, ""},
		{"all lists", Program{Name: "thumbs-1", Host: []string{"image.resize"}, Call: []string{"echo"}, Serve: []string{"thumbs"},
			Submit: []string{"mail"}, Publish: []string{"door.opened"}, Subscribe: []string{"door.>"}}, ""},
		{"empty name", Program{}, "program name"},
		{"dotted name", Program{Name: "a.b"}, "program name"},
		{"name with space", Program{Name: "a b"}, "program name"},
		{"host wildcard", Program{Name: "p", Host: []string{"*"}}, "host"},
		{"host gt", Program{Name: "p", Host: []string{"image.>"}}, "host"},
		{"host the node's blob capability", Program{Name: "p", Host: []string{"meshbox.blob.chunk"}}, "node's own"},
		{"host the node's micro discovery", Program{Name: "p", Host: []string{"meshbox.micro"}}, "node's own"},
		{"host any name of the node's", Program{Name: "p", Host: []string{"meshbox.next"}}, "node's own"},
		{"host a name that starts so", Program{Name: "p", Host: []string{"meshboxes.list"}}, ""},
		{"call blob capabilities", Program{Name: "p", Call: []string{"meshbox.blob.>"}, Blobs: true}, ""},
		{"serve wildcard", Program{Name: "p", Serve: []string{">"}}, "serve"},
		{"call wildcard", Program{Name: "p", Call: []string{"image.*"}}, ""},
		{"call everything", Program{Name: "p", Call: []string{">"}}, ""},
		{"subscribe gt not last", Program{Name: "p", Subscribe: []string{">.x"}}, "last token"},
		{"publish empty token", Program{Name: "p", Publish: []string{"a..b"}}, "publish"},
		{"submit non ascii", Program{Name: "p", Submit: []string{"café"}}, "submit"},
		{"bad key", Program{Name: "p", Key: "SUAXYZ"}, "public user nkey"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tt.want != "" && err == nil:
				t.Fatalf("got valid, want an error with %q", tt.want)
			case tt.want != "" && (!strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalid)):
				t.Fatalf("got %v, want ErrInvalid with %q", err, tt.want)
			}
		})
	}
}

func TestPermissions(t *testing.T) {
	p := Program{Name: "thumbs", Host: []string{"resize"}, Call: []string{"echo"}, Serve: []string{"thumbs"},
		Submit: []string{"mail"}, Publish: []string{"door.opened"}, Subscribe: []string{"door.>"}}
	perms := p.Permissions()
	// A host and handler answers on inboxes (its callers'): no
	// allow_responses, which would let it publish on any reply subject a
	// caller chose.
	wantPub := []string{"_INBOX.>", "cap.echo", "cmd.mail", "evt.door.opened", "node.*.cap.echo"}
	wantSub := []string{"_INBOX.thumbs.>", "cap.resize", "evt.door.>", "work.thumbs"}
	if !slices.Equal(perms.Publish.Allow, wantPub) {
		t.Errorf("publish: got %v, want %v", perms.Publish.Allow, wantPub)
	}
	if !slices.Equal(perms.Subscribe.Allow, wantSub) {
		t.Errorf("subscribe: got %v, want %v", perms.Subscribe.Allow, wantSub)
	}
	if perms.Response != nil {
		t.Errorf("responses: got %+v, want none (allow_responses passes any reply subject a caller chose)", perms.Response)
	}

	// A program that only listens may publish nothing: an empty allow
	// list, never a missing one (which would allow everything).
	quiet := Program{Name: "quiet", Subscribe: []string{"x"}}.Permissions()
	if quiet.Publish == nil || quiet.Publish.Allow == nil || len(quiet.Publish.Allow) != 0 {
		t.Errorf("publish of a listener: got %+v, want an empty allow list", quiet.Publish)
	}
	if quiet.Response != nil {
		t.Errorf("responses of a listener: got %+v, want none", quiet.Response)
	}
	if slices.Contains(quiet.Publish.Allow, "_INBOX.>") || slices.Contains(Program{Name: "c", Call: []string{"x"}}.Permissions().Publish.Allow, "_INBOX.>") {
		t.Errorf("a program that neither hosts nor serves may publish on inboxes")
	}
	for _, s := range append(perms.Subscribe.Allow, perms.Publish.Allow...) {
		if strings.HasPrefix(s, "$MESH") || s == "work.>" || s == "cap.>" || s == ">" {
			t.Errorf("permission %q reaches beyond the program's lists", s)
		}
	}
	for _, s := range perms.Subscribe.Allow {
		if s == "_INBOX.>" {
			t.Errorf("permission %q reaches beyond the program's lists", s)
		}
	}
}

func TestStorePutKeepsKeyAndWritesSeed(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "programs"))
	if err != nil {
		t.Fatal(err)
	}
	path, err := s.Put(Program{Name: "echo", Host: []string{"echo", "echo"}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := s.Get("echo")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(first.Host, []string{"echo"}) {
		t.Errorf("host: got %v, want [echo] (deduplicated)", first.Host)
	}
	key, err := LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if key.Public() != first.Key {
		t.Errorf("seed file's public key %s, definition's %s", key.Public(), first.Key)
	}
	for _, f := range []string{path, filepath.Join(s.Dir(), "echo.json")} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	if strings.HasPrefix(key.String(), "SU") || !nkeys.IsValidPublicUserKey(key.String()) { // a seed starts with SU; a public key may hold it anywhere
		t.Errorf("a key prints %q: want its public half only", key.String())
	}

	// Changing the lists keeps the key: the program's file stays good.
	if _, err := s.Put(Program{Name: "echo", Call: []string{"clock"}}); err != nil {
		t.Fatal(err)
	}
	second, err := s.Get("echo")
	if err != nil {
		t.Fatal(err)
	}
	if second.Key != first.Key || len(second.Host) != 0 || !slices.Equal(second.Call, []string{"clock"}) {
		t.Errorf("after a change: got %+v, want key %s, no host, call [clock]", second, first.Key)
	}

	if err := s.Remove("echo"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("seed file after remove: %v, want gone", err)
	}
	if _, err := s.Get("echo"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get after remove: got %v, want ErrNotFound", err)
	}
	if err := s.Remove("echo"); !errors.Is(err, ErrNotFound) {
		t.Errorf("remove twice: got %v, want ErrNotFound", err)
	}
}

func TestStoreListReportsBadFilesAndKeepsTheOthers(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"b", "a"} {
		if _, err := s.Put(Program{Name: n, Call: []string{"echo"}}); err != nil {
			t.Fatal(err)
		}
	}
	bad := map[string]string{
		"broken.json":  `{"name": "broken",`,
		"unknown.json": `{"name": "unknown", "key": "UAAA", "hosts": ["x"]}`,
		"other.json":   `{"name": "someone-else", "key": "UAAA"}`,
		"nokey.json":   `{"name": "nokey"}`,
		"wild.json":    `{"name": "wild", "host": [">"], "key": "` + mustUserKey(t) + `"}`,
	}
	for f, data := range bad {
		if err := os.WriteFile(filepath.Join(s.Dir(), f), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	progs, errs := s.List()
	var got []string
	for _, p := range progs {
		got = append(got, p.Name)
	}
	if !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("programs: got %v, want [a b]", got)
	}
	if len(errs) != len(bad) {
		t.Fatalf("errors: got %d (%v), want %d", len(errs), errs, len(bad))
	}
	for _, err := range errs {
		named := false
		for f := range bad {
			named = named || strings.Contains(err.Error(), filepath.Join(s.Dir(), f))
		}
		if !named {
			t.Errorf("error %q does not name its file", err)
		}
	}
}

func TestEnsureAdmin(t *testing.T) {
	dir := t.TempDir()
	k1, err := EnsureAdmin(dir)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := EnsureAdmin(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k1.Public() != k2.Public() {
		t.Errorf("second EnsureAdmin made a new key: %s, then %s", k1.Public(), k2.Public())
	}
	fi, err := os.Stat(filepath.Join(dir, AdminFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("admin credential mode %v, want 0600", fi.Mode().Perm())
	}
	sig, err := k1.Sign([]byte("nonce"))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := nkeys.FromPublicKey(k1.Public())
	if err := pub.Verify([]byte("nonce"), sig); err != nil {
		t.Errorf("signature does not verify: %v", err)
	}
}

func mustUserKey(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestService: a program may answer the micro discovery requests of the
// services it was given and of no other, and a service needs endpoints.
func TestService(t *testing.T) {
	for _, tt := range []struct {
		name string
		p    Program
		want string // "" valid, else a piece of the error
	}{
		{"with host", Program{Name: "p", Host: []string{"lamp.on"}, Service: []string{"lamps"}}, ""},
		{"with serve", Program{Name: "p", Serve: []string{"thumbs"}, Service: []string{"thumbs-svc", "other_1"}}, ""},
		{"no endpoints", Program{Name: "p", Call: []string{"echo"}, Service: []string{"lamps"}}, "give host or serve"},
		{"dotted", Program{Name: "p", Host: []string{"lamp"}, Service: []string{"lamp.on"}}, "service"},
		{"wildcard", Program{Name: "p", Host: []string{"lamp"}, Service: []string{"*"}}, "service"},
		{"gt", Program{Name: "p", Host: []string{"lamp"}, Service: []string{">"}}, "service"},
		{"empty", Program{Name: "p", Host: []string{"lamp"}, Service: []string{""}}, "service"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tt.want != "" && err == nil:
				t.Fatalf("got valid, want an error with %q", tt.want)
			case tt.want != "" && (!strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalid)):
				t.Fatalf("got %v, want ErrInvalid with %q", err, tt.want)
			}
		})
	}

	sub := Program{Name: "lamps", Host: []string{"lamp"}, Service: []string{"lampsvc"}}.Permissions().Subscribe.Allow
	want := []string{"$SRV.INFO", "$SRV.INFO.lampsvc", "$SRV.INFO.lampsvc.*", "$SRV.PING", "$SRV.PING.lampsvc", "$SRV.PING.lampsvc.*",
		"$SRV.STATS", "$SRV.STATS.lampsvc", "$SRV.STATS.lampsvc.*", "_INBOX.lamps.>", "cap.lamp"}
	if !slices.Equal(sub, want) {
		t.Errorf("subscribe of a micro service: got %v, want %v", sub, want)
	}
	pub := Program{Name: "lamps", Host: []string{"lamp"}, Service: []string{"lampsvc"}}.Permissions().Publish.Allow
	for _, s := range pub {
		if strings.HasPrefix(s, "$SRV") {
			t.Errorf("publish of a micro service: %q, want no $SRV subject (answers go to inboxes)", s)
		}
	}
	for _, s := range (Program{Name: "plain", Host: []string{"lamp"}}).Permissions().Subscribe.Allow {
		if strings.HasPrefix(s, "$SRV") {
			t.Errorf("subscribe of a host without a service: %q, want no $SRV subject", s)
		}
	}
}
