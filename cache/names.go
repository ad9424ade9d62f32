package cache

import (
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits on names and values accepted into the bindings.
const (
	MaxNodeNameLen = 64        // node names: [A-Za-z0-9_-]
	MaxNameLen     = 128       // modules, keys, resources, providers
	MaxValueLen    = 64 * 1024 // setting, override, identity and credential values
)

// ValidateNodeName checks a node's mesh name: 1 to 64 characters from
// [A-Za-z0-9_-], which is safe as an AMQP exchange name and a NATS token.
func ValidateNodeName(name string) error {
	return checkName("node name", name, MaxNodeNameLen, false, "")
}

// ValidateModuleName checks a module name: 1 to 128 characters from
// [A-Za-z0-9_.-], starting with a letter or digit.
func ValidateModuleName(name string) error {
	return checkName("module name", name, MaxNameLen, true, ".")
}

// ValidateSettingKey checks a mesh setting key such as "broker.url": 1 to
// 128 characters from [a-z0-9_.-], starting with a letter or digit.
func ValidateSettingKey(key string) error {
	if err := checkName("setting key", key, MaxNameLen, true, "."); err != nil {
		return err
	}
	if strings.ToLower(key) != key {
		return &NameError{Field: "setting key", Value: key, Reason: "must be lower case"}
	}
	return nil
}

// ValidateOverrideKey checks an override key: 1 to 128 characters from
// [A-Za-z0-9_.-], starting with a letter or digit.
func ValidateOverrideKey(key string) error {
	return checkName("override key", key, MaxNameLen, true, ".")
}

// ValidateResourceName checks a grant's resource or provider name (field
// says which): 1 to 128 characters from [A-Za-z0-9_.:/@-], starting with a
// letter or digit.
func ValidateResourceName(field, name string) error {
	return checkName(field, name, MaxNameLen, true, ".:/@")
}

// ValidateValue checks a free-text value (field names it): valid UTF-8,
// no NUL byte, at most 64 KiB.
func ValidateValue(field, v string) error {
	switch {
	case len(v) > MaxValueLen:
		return &NameError{Field: field, Value: v, Reason: "longer than 64 KiB"}
	case !utf8.ValidString(v):
		return &NameError{Field: field, Value: v, Reason: "not valid UTF-8"}
	case strings.IndexByte(v, 0) >= 0:
		return &NameError{Field: field, Value: v, Reason: "contains a NUL byte"}
	}
	return nil
}

// ValidatePublicName checks a node's optional public (DNS) name: empty, or
// up to 253 characters from [A-Za-z0-9.-].
func ValidatePublicName(name string) error {
	if name == "" {
		return nil
	}
	return checkName("public name", name, 253, true, ".")
}

// ValidateBrokerURL checks the broker.url setting: an amqp:// or amqps://
// URL with a host.
func ValidateBrokerURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return &NameError{Field: "broker URL", Value: RedactURL(raw), Reason: "not a URL"}
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return &NameError{Field: "broker URL", Value: RedactURL(raw), Reason: "scheme must be amqp or amqps"}
	}
	if u.Host == "" {
		return &NameError{Field: "broker URL", Value: RedactURL(raw), Reason: "has no host"}
	}
	return nil
}

// checkName validates name against [A-Za-z0-9_-] plus extra characters;
// underscore and dash are always allowed. With alnumFirst, the first
// character must be a letter or digit.
func checkName(field, name string, maxLen int, alnumFirst bool, extra string) error {
	if name == "" {
		return &NameError{Field: field, Value: name, Reason: "must not be empty"}
	}
	if len(name) > maxLen {
		return &NameError{Field: field, Value: name, Reason: "longer than " + strconv.Itoa(maxLen) + " characters"}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && alnumFirst && !alnum {
			return &NameError{Field: field, Value: name, Reason: "must start with a letter or digit"}
		}
		if alnum || c == '_' || c == '-' || strings.IndexByte(extra, c) >= 0 {
			continue
		}
		return &NameError{Field: field, Value: name, Reason: "may only contain letters, digits, '_', '-'" + quoteChars(extra)}
	}
	return nil
}

func quoteChars(extra string) string {
	var b strings.Builder
	for _, c := range extra {
		b.WriteString(", '")
		b.WriteRune(c)
		b.WriteString("'")
	}
	return b.String()
}

// RedactURL returns raw with any password in it replaced by "xxxxx"; a
// value that does not parse as a URL with user info is returned unchanged.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); !ok {
		return raw
	}
	return u.Redacted()
}

// secretWords mark keys whose values are never shown in reports.
var secretWords = []string{"password", "passwd", "secret", "token", "credential", "private", "apikey", "api_key", "api-key"}

// looksSecret reports whether a setting or override key names a secret.
func looksSecret(key string) bool {
	k := strings.ToLower(key)
	for _, w := range secretWords {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// displayValue renders a setting or override value for logs and reports:
// secret-looking keys are redacted, URL passwords masked, long values cut.
func displayValue(key, v string) string {
	if looksSecret(key) {
		return redacted
	}
	v = RedactURL(v)
	if len(v) > 120 {
		v = v[:120] + "..."
	}
	return v
}
