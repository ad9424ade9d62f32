package names

import (
	"fmt"
	"strconv"
	"strings"
)

// Length limits, in bytes.
const (
	MaxNode   = 64  // node names
	MaxDotted = 128 // capability and stage names, topics, system keys
	MaxKey    = 128 // module names, setting and override keys, resources, providers
	MaxPublic = 253 // public (DNS) names
	MaxLabel  = 63  // one label of a public name
)

// Kind is what a name names. Its String is how errors call it.
type Kind uint8

// The kinds of names.
const (
	KindNode Kind = iota + 1
	KindCapability
	KindStage
	KindTopic
	KindSystemKey
	KindModule
	KindSettingKey
	KindOverrideKey
	KindResource
	KindProvider
	KindPublicName
	KindScope
	KindService
)

// Kinds lists every kind, in order.
var Kinds = []Kind{KindNode, KindCapability, KindStage, KindTopic, KindSystemKey,
	KindModule, KindSettingKey, KindOverrideKey, KindResource, KindProvider, KindPublicName, KindScope, KindService}

var kindNames = [...]string{
	KindNode:        "node name",
	KindCapability:  "capability name",
	KindStage:       "stage name",
	KindTopic:       "topic",
	KindSystemKey:   "system key",
	KindModule:      "module name",
	KindSettingKey:  "setting key",
	KindOverrideKey: "override key",
	KindResource:    "resource name",
	KindProvider:    "provider name",
	KindPublicName:  "public name",
	KindScope:       "scope name",
	KindService:     "service name",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "kind " + strconv.Itoa(int(k)) + " name"
}

// Check checks s against the rules of kind k. An unknown kind rejects
// every name.
func Check(k Kind, s string) error {
	if int(k) < len(checks) && checks[k] != nil {
		return checks[k](s)
	}
	return &Error{Kind: k, Name: s, Pos: -1, Reason: "unknown kind of name", Err: ErrByte}
}

var checks = [...]func(string) error{
	KindNode:        Node,
	KindCapability:  Capability,
	KindStage:       Stage,
	KindTopic:       Topic,
	KindSystemKey:   SystemKey,
	KindModule:      Module,
	KindSettingKey:  SettingKey,
	KindOverrideKey: OverrideKey,
	KindResource:    Resource,
	KindProvider:    Provider,
	KindPublicName:  PublicName,
	KindScope:       Scope,
	KindService:     Service,
}

// Node checks a node's mesh name: 1 to 64 bytes of [A-Za-z0-9_-].
func Node(s string) error {
	if err := length(KindNode, s, MaxNode); err != nil {
		return err
	}
	for i := 0; i < len(s); i++ {
		if !isTokenByte(s[i]) {
			return badByte(KindNode, s, i, "[A-Za-z0-9_-]", "")
		}
	}
	return nil
}

// Scope checks a scope's name (a smaller trust boundary inside a mesh,
// with its own content key): 1 to 64 bytes of [A-Za-z0-9_-], as a node's.
func Scope(s string) error {
	if err := length(KindScope, s, MaxNode); err != nil {
		return err
	}
	for i := 0; i < len(s); i++ {
		if !isTokenByte(s[i]) {
			return badByte(KindScope, s, i, "[A-Za-z0-9_-]", "")
		}
	}
	return nil
}

// Service checks the name of a NATS micro service a local program runs:
// 1 to 64 bytes of [A-Za-z0-9_-], the names the micro framework accepts
// (one subject token), as long as a node's.
func Service(s string) error {
	if err := length(KindService, s, MaxNode); err != nil {
		return err
	}
	for i := 0; i < len(s); i++ {
		if !isTokenByte(s[i]) {
			return badByte(KindService, s, i, "[A-Za-z0-9_-]", "")
		}
	}
	return nil
}

// Capability checks a capability name: 1 to 128 bytes of dot-separated
// tokens of [A-Za-z0-9_-].
func Capability(s string) error { return dotted(KindCapability, s) }

// Stage checks a stage name; the rules are a capability's.
func Stage(s string) error { return dotted(KindStage, s) }

// Topic checks an event topic; the rules are a capability's.
func Topic(s string) error { return dotted(KindTopic, s) }

// SystemKey checks the key of a system message (sys.<key>); the rules are
// a capability's.
func SystemKey(s string) error { return dotted(KindSystemKey, s) }

// Module checks a module name: 1 to 128 bytes of [A-Za-z0-9_.-], starting
// with a letter or digit.
func Module(s string) error { return key(KindModule, s, MaxKey, isKeyByte, "[A-Za-z0-9_.-]") }

// OverrideKey checks an override key; the rules are a module name's.
func OverrideKey(s string) error {
	return key(KindOverrideKey, s, MaxKey, isKeyByte, "[A-Za-z0-9_.-]")
}

// SettingKey checks a mesh setting key such as "broker.url": 1 to 128
// bytes of [a-z0-9_.-], starting with a letter or digit.
func SettingKey(s string) error {
	return key(KindSettingKey, s, MaxKey, isLowerKeyByte, "[a-z0-9_.-]")
}

// Resource checks a grant's resource name: 1 to 128 bytes of
// [A-Za-z0-9_.:/@-], starting with a letter or digit.
func Resource(s string) error {
	return key(KindResource, s, MaxKey, isResourceByte, "[A-Za-z0-9_.:/@-]")
}

// Provider checks a grant's provider name; the rules are a resource's.
func Provider(s string) error {
	return key(KindProvider, s, MaxKey, isResourceByte, "[A-Za-z0-9_.:/@-]")
}

// PublicName checks a node's public (DNS) name: at most 253 bytes of
// dot-separated labels, each 1 to 63 bytes of [A-Za-z0-9-] neither starting
// nor ending with '-'. Whether a node must have one is its caller's rule.
func PublicName(s string) error {
	const k = KindPublicName
	if err := length(k, s, MaxPublic); err != nil {
		return err
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			if c := s[i]; !isAlnum(c) && c != '-' {
				return badByte(k, s, i, "[A-Za-z0-9.-]", "")
			}
			continue
		}
		switch label := s[start:i]; {
		case label == "":
			return emptyToken(k, s, i, "label")
		case len(label) > MaxLabel:
			return &Error{Kind: k, Name: s, Pos: start, Err: ErrTooLong,
				Reason: fmt.Sprintf("label at byte %d is %d bytes, more than %d", start, len(label), MaxLabel)}
		case label[0] == '-' || label[len(label)-1] == '-':
			return &Error{Kind: k, Name: s, Pos: start, Err: ErrStart,
				Reason: fmt.Sprintf("label at byte %d starts or ends with '-'", start)}
		}
		start = i + 1
	}
	return nil
}

// NodeFromHost turns a host name into a valid node name: its first label,
// with every byte outside [A-Za-z0-9_-] (each rune of a non-ASCII letter)
// replaced by '-', cut at 64 bytes; "meshbox" when nothing is left.
func NodeFromHost(host string) string {
	host, _, _ = strings.Cut(host, ".")
	var b strings.Builder
	for _, r := range host {
		if r < 0x80 && isTokenByte(byte(r)) {
			b.WriteByte(byte(r))
		} else {
			b.WriteByte('-')
		}
		if b.Len() == MaxNode {
			break
		}
	}
	if b.Len() == 0 {
		return "meshbox"
	}
	return b.String()
}

// dotted checks dot-separated tokens of [A-Za-z0-9_-], 1 to MaxDotted bytes.
func dotted(k Kind, s string) error {
	if err := length(k, s, MaxDotted); err != nil {
		return err
	}
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '.' {
			if i == start {
				return emptyToken(k, s, i, "token")
			}
			start = i + 1
			continue
		}
		if !isTokenByte(c) {
			return badByte(k, s, i, "[A-Za-z0-9_.-]", "")
		}
	}
	if start == len(s) {
		return emptyToken(k, s, len(s), "token")
	}
	return nil
}

// key checks 1 to max bytes of an alphabet, starting with a letter or digit.
func key(k Kind, s string, max int, ok func(byte) bool, alphabet string) error {
	if err := length(k, s, max); err != nil {
		return err
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !ok(c) {
			hint := ""
			if k == KindSettingKey && c >= 'A' && c <= 'Z' {
				hint = " (setting keys are lower case)"
			}
			return badByte(k, s, i, alphabet, hint)
		}
		if i == 0 && !isAlnum(c) {
			return &Error{Kind: k, Name: s, Pos: 0, Err: ErrStart,
				Reason: fmt.Sprintf("starts with %s, not a letter or digit", showByte(c))}
		}
	}
	return nil
}

func length(k Kind, s string, max int) error {
	switch {
	case s == "":
		return &Error{Kind: k, Name: s, Pos: -1, Err: ErrEmpty, Reason: "empty"}
	case len(s) > max:
		return &Error{Kind: k, Name: s, Pos: -1, Err: ErrTooLong,
			Reason: fmt.Sprintf("%d bytes, more than %d", len(s), max)}
	}
	return nil
}

func badByte(k Kind, s string, i int, alphabet, hint string) error {
	return &Error{Kind: k, Name: s, Pos: i, Err: ErrByte,
		Reason: fmt.Sprintf("byte %d %s is not in %s%s", i, showByte(s[i]), alphabet, hint)}
}

func emptyToken(k Kind, s string, i int, what string) error {
	return &Error{Kind: k, Name: s, Pos: i, Err: ErrToken,
		Reason: fmt.Sprintf("empty %s at byte %d ('.' only between %ss)", what, i, what)}
}

// showByte renders c as '<c>' (0x..) when printable ASCII, else (0x..).
func showByte(c byte) string {
	if c > ' ' && c < 0x7f {
		return fmt.Sprintf("(%q)", rune(c))
	}
	return fmt.Sprintf("(0x%02x)", c)
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// isTokenByte reports whether c may appear in a node name or a token of a
// dotted name: [A-Za-z0-9_-].
func isTokenByte(c byte) bool { return isAlnum(c) || c == '_' || c == '-' }

func isKeyByte(c byte) bool { return isTokenByte(c) || c == '.' }

func isLowerKeyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
}

func isResourceByte(c byte) bool {
	return isKeyByte(c) || c == ':' || c == '/' || c == '@'
}
