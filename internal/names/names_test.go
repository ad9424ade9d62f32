package names_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/names/namestest"
)

var rules = []error{names.ErrEmpty, names.ErrTooLong, names.ErrByte, names.ErrToken, names.ErrStart}

// ok marks a name a kind accepts in the table below.
var ok error

func TestRules(t *testing.T) {
	var (
		empty = names.ErrEmpty
		long  = names.ErrTooLong
		bad   = names.ErrByte
		token = names.ErrToken
		start = names.ErrStart
	)
	tests := []struct {
		name string
		// What each kind answers: node; capability, stage, topic and
		// system key (one grammar); module and override key (one
		// grammar); setting key; resource and provider (one grammar);
		// public name.
		node, dotted, key, setting, resource, public error
	}{
		{"echo", ok, ok, ok, ok, ok, ok},
		{"Node-1_B", ok, ok, ok, bad, ok, bad},
		{"image.resize", bad, ok, ok, ok, ok, ok},
		{"broker.url", bad, ok, ok, ok, ok, ok},
		{"box1.example.org", bad, ok, ok, ok, ok, ok},
		{"UPPER", ok, ok, ok, bad, ok, ok},
		{"9lives", ok, ok, ok, ok, ok, ok},
		{"-dash", ok, ok, start, start, start, start},
		{"_under", ok, ok, start, start, start, bad},
		{".hidden", bad, token, start, start, start, token},
		{"..", bad, token, start, start, start, token},
		{"a.b.c.d", bad, ok, ok, ok, ok, ok},
		{"a-b.example", bad, ok, ok, ok, ok, ok},
		{"a-.example", bad, ok, ok, ok, ok, start},
		// cap.café: the bridge used to host it, the node never advertised it.
		{"café", bad, bad, bad, bad, bad, bad},
		{"cap.café", bad, bad, bad, bad, bad, bad},
		{"ünïcode.ok", bad, bad, bad, bad, bad, bad},
		{"", empty, empty, empty, empty, empty, empty},
		{".a", bad, token, start, start, start, token},
		{"a.", bad, token, ok, ok, ok, token},
		{"a..b", bad, token, ok, ok, ok, token},
		{"*", bad, bad, bad, bad, bad, bad},
		{">", bad, bad, bad, bad, bad, bad},
		{"a.*", bad, bad, bad, bad, bad, bad},
		{"a.>", bad, bad, bad, bad, bad, bad},
		{"a#b", bad, bad, bad, bad, bad, bad},
		{"$SYS", bad, bad, bad, bad, bad, bad},
		{"a b", bad, bad, bad, bad, bad, bad},
		{"a\tb", bad, bad, bad, bad, bad, bad},
		{"a\x00b", bad, bad, bad, bad, bad, bad},
		{"a\x7fb", bad, bad, bad, bad, bad, bad},
		{"echo ", bad, bad, bad, bad, bad, bad},
		{"a/b", bad, bad, bad, bad, ok, bad},
		{"s3://bucket/path", bad, bad, bad, bad, ok, bad},
		{"bucket@n2", bad, bad, bad, bad, ok, bad},
		{"a,b", bad, bad, bad, bad, bad, bad},
		{"\xff", bad, bad, bad, bad, bad, bad},
		{"ｅｃｈｏ", bad, bad, bad, bad, bad, bad},
		{"Broker.url", bad, ok, ok, bad, ok, ok},
		{strings.Repeat("a", 64), ok, ok, ok, ok, ok, long},
		{strings.Repeat("a", 65), long, ok, ok, ok, ok, long},
		{strings.Repeat("a", 128), long, ok, ok, ok, ok, long},
		{strings.Repeat("a", 129), long, long, long, long, long, long},
		{strings.Repeat("a", 63) + ".example", long, ok, ok, ok, ok, ok},
		{strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 61), long, long, long, long, long, ok},
		{strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("a", 62), long, long, long, long, long, long},
	}
	for _, tt := range tests {
		want := map[names.Kind]error{
			names.KindNode: tt.node, names.KindCapability: tt.dotted, names.KindStage: tt.dotted,
			names.KindTopic: tt.dotted, names.KindSystemKey: tt.dotted, names.KindModule: tt.key,
			names.KindOverrideKey: tt.key, names.KindSettingKey: tt.setting,
			names.KindResource: tt.resource, names.KindProvider: tt.resource, names.KindPublicName: tt.public,
			names.KindScope: tt.node, names.KindService: tt.node,
		}
		for _, k := range names.Kinds {
			err := names.Check(k, tt.name)
			switch w := want[k]; {
			case w == nil && err != nil:
				t.Errorf("%s %.40q: got %v, want it accepted", k, tt.name, err)
			case w != nil && !errors.Is(err, w):
				t.Errorf("%s %.40q: got %v, want %v", k, tt.name, err, w)
			}
		}
	}
}

func TestKindFunctions(t *testing.T) {
	funcs := map[names.Kind]func(string) error{
		names.KindNode: names.Node, names.KindCapability: names.Capability, names.KindStage: names.Stage,
		names.KindTopic: names.Topic, names.KindSystemKey: names.SystemKey, names.KindModule: names.Module,
		names.KindSettingKey: names.SettingKey, names.KindOverrideKey: names.OverrideKey,
		names.KindResource: names.Resource, names.KindProvider: names.Provider, names.KindPublicName: names.PublicName,
		names.KindScope: names.Scope, names.KindService: names.Service,
	}
	if len(funcs) != len(names.Kinds) {
		t.Fatalf("got %d functions for %d kinds", len(funcs), len(names.Kinds))
	}
	for _, s := range namestest.Inputs() {
		for k, f := range funcs {
			got, want := f(s), names.Check(k, s)
			if (got == nil) != (want == nil) || got != nil && got.Error() != want.Error() {
				t.Errorf("%s %.40q: function says %v, Check says %v", k, s, got, want)
			}
			var ne *names.Error
			if got != nil && (!errors.As(got, &ne) || ne.Kind != k) {
				t.Errorf("%s %.40q: got %v, want a *names.Error of its kind", k, s, got)
			}
		}
	}
}

func TestErrorText(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{names.Capability("café"), `capability name "café": byte 3 (0xc3) is not in [A-Za-z0-9_.-]`},
		{names.Node("a.b"), `node name "a.b": byte 1 ('.') is not in [A-Za-z0-9_-]`},
		{names.Stage("a..b"), `stage name "a..b": empty token at byte 2 ('.' only between tokens)`},
		{names.Topic("a."), `topic "a.": empty token at byte 2 ('.' only between tokens)`},
		{names.Capability("a.*"), `capability name "a.*": byte 2 ('*') is not in [A-Za-z0-9_.-]`},
		{names.Node(""), `node name "": empty`},
		{names.Node(strings.Repeat("x", 65)), `node name "` + strings.Repeat("x", 65) + `": 65 bytes, more than 64`},
		{names.Module("-x"), `module name "-x": starts with ('-'), not a letter or digit`},
		{names.SettingKey("Broker.url"), `setting key "Broker.url": byte 0 ('B') is not in [a-z0-9_.-] (setting keys are lower case)`},
		{names.PublicName("a-.example"), `public name "a-.example": label at byte 0 starts or ends with '-'`},
		{names.Capability(strings.Repeat("y", 200)), `capability name "` + strings.Repeat("y", 80) + `"...: 200 bytes, more than 128`},
	}
	for _, tt := range tests {
		if tt.err == nil || tt.err.Error() != tt.want {
			t.Errorf("got %v, want %s", tt.err, tt.want)
		}
	}
}

func TestErrorWrapsOneRule(t *testing.T) {
	err := names.Capability("café")
	if !errors.Is(err, names.ErrInvalid) || !errors.Is(err, names.ErrByte) || errors.Is(err, names.ErrToken) {
		t.Fatalf("got %v, want ErrInvalid and ErrByte only", err)
	}
	var ne *names.Error
	if !errors.As(err, &ne) || ne.Kind != names.KindCapability || ne.Name != "café" || ne.Pos != 3 {
		t.Fatalf("got %+v, want kind capability, name café, pos 3", ne)
	}
}

func TestCaseSensitive(t *testing.T) {
	// Both spellings are valid and distinct: nothing folds case.
	for _, s := range []string{"Echo", "echo", "ECHO"} {
		if err := names.Capability(s); err != nil {
			t.Errorf("capability %q: got %v, want it accepted", s, err)
		}
	}
	if err := names.SettingKey("broker.URL"); !errors.Is(err, names.ErrByte) {
		t.Errorf("setting key broker.URL: got %v, want ErrByte", err)
	}
}

func TestNodeFromHost(t *testing.T) {
	tests := map[string]string{
		"box1.example.org":      "box1",
		"my box":                "my-box",
		"":                      "meshbox",
		".example":              "meshbox",
		"ünï":                   "-n-",
		strings.Repeat("h", 80): strings.Repeat("h", 64),
		strings.Repeat("é", 70): strings.Repeat("-", 64),
		"Node_7-x.lan":          "Node_7-x",
	}
	for in, want := range tests {
		got := names.NodeFromHost(in)
		if got != want {
			t.Errorf("NodeFromHost(%q): got %q, want %q", in, got, want)
		}
		if err := names.Node(got); err != nil {
			t.Errorf("NodeFromHost(%q) = %q: %v", in, got, err)
		}
	}
}

func TestValidNamesDoNotAllocate(t *testing.T) {
	for _, k := range names.Kinds {
		s := "echo"
		allocs := testing.AllocsPerRun(100, func() {
			if names.Check(k, s) != nil {
				t.Fatalf("%s %q rejected", k, s)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: got %v allocations for a valid name, want 0", k, allocs)
		}
	}
}

// Oracles: each rule written a second way, as the regular expression a
// reader (or the database's CHECK constraint) would write.
var oracles = map[names.Kind]func(string) bool{
	names.KindNode:        match(`^[A-Za-z0-9_-]{1,64}$`, names.MaxNode),
	names.KindScope:       match(`^[A-Za-z0-9_-]{1,64}$`, names.MaxNode),
	names.KindService:     match(`^[A-Za-z0-9_-]{1,64}$`, names.MaxNode),
	names.KindCapability:  match(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`, names.MaxDotted),
	names.KindStage:       match(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`, names.MaxDotted),
	names.KindTopic:       match(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`, names.MaxDotted),
	names.KindSystemKey:   match(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`, names.MaxDotted),
	names.KindModule:      match(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`, names.MaxKey),
	names.KindOverrideKey: match(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`, names.MaxKey),
	names.KindSettingKey:  match(`^[a-z0-9][a-z0-9_.-]{0,127}$`, names.MaxKey),
	names.KindResource:    match(`^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$`, names.MaxKey),
	names.KindProvider:    match(`^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$`, names.MaxKey),
	names.KindPublicName: match(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`,
		names.MaxPublic),
}

func match(expr string, max int) func(string) bool {
	re := regexp.MustCompile(expr)
	return func(s string) bool { return len(s) <= max && re.MatchString(s) }
}

// FuzzNames checks every kind against its oracle, the shape of every
// rejection, and that every accepted name is safe where meshbox puts it.
func FuzzNames(f *testing.F) {
	for _, s := range namestest.Inputs() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, k := range names.Kinds {
			err := names.Check(k, s)
			if want := oracles[k](s); (err == nil) != want {
				t.Fatalf("%s %q: got %v, oracle says valid=%v", k, s, err, want)
			}
			if err != nil {
				checkError(t, k, s, err)
				continue
			}
			checkSafe(t, k, s)
		}
		if names.Node(s) == nil && names.Capability(s) != nil {
			t.Fatalf("%q is a node name but not a one-token capability name", s)
		}
		if h := names.NodeFromHost(s); names.Node(h) != nil {
			t.Fatalf("NodeFromHost(%q) = %q, not a node name", s, h)
		}
	})
}

func checkError(t *testing.T, k names.Kind, s string, err error) {
	t.Helper()
	var ne *names.Error
	if !errors.As(err, &ne) || !errors.Is(err, names.ErrInvalid) {
		t.Fatalf("%s %q: got %T %v, want a *names.Error wrapping ErrInvalid", k, s, err, err)
	}
	n := 0
	for _, r := range rules {
		if errors.Is(err, r) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%s %q: %v wraps %d rules, want 1", k, s, err, n)
	}
	if ne.Kind != k || ne.Name != s || ne.Reason == "" || ne.Pos < -1 || ne.Pos > len(s) {
		t.Fatalf("%s %q: got %+v", k, s, ne)
	}
	if !strings.HasPrefix(err.Error(), k.String()+" ") {
		t.Fatalf("%s %q: message %q does not start with the kind", k, s, err)
	}
}

// checkSafe checks an accepted name where meshbox uses it: NATS subject
// tokens without wildcards or whitespace, AMQP names within 255 bytes, and
// plain ASCII for PostgreSQL, RabbitMQ user names and file names.
func checkSafe(t *testing.T, k names.Kind, s string) {
	t.Helper()
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("*>#$\"'\\,;", c) >= 0 {
			t.Fatalf("%s %q: accepted byte %d (0x%02x)", k, s, i, c)
		}
	}
	longNode := strings.Repeat("n", names.MaxNode)
	switch k {
	case names.KindNode:
		if strings.Contains(s, ".") {
			t.Fatalf("node name %q holds a dot", s)
		}
		if q := "node." + s + ".requests"; len(q) > 255 {
			t.Fatalf("queue %q longer than 255 bytes", q)
		}
	case names.KindCapability, names.KindStage, names.KindTopic, names.KindSystemKey:
		for tok := range strings.SplitSeq(s, ".") {
			if tok == "" {
				t.Fatalf("%s %q has an empty NATS token", k, s)
			}
		}
		for _, key := range []string{"to." + longNode + ".req." + s, "to." + longNode + ".sys." + s, "cmd." + s, "evt." + s} {
			if len(key) > 255 {
				t.Fatalf("%s %q: routing key %q longer than 255 bytes", k, s, key)
			}
		}
	case names.KindModule:
		if s == "." || s == ".." || strings.HasPrefix(s, "-") || strings.ContainsAny(s, "/\x00") {
			t.Fatalf("module name %q is not a safe directory name", s)
		}
	}
}
