package cache

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/meshbox/meshbox/internal/brokerurl"
	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/redact"
)

// Limits on names and values accepted into the bindings. The rules for
// names live in package names; the Validate functions below apply them and
// report a *NameError.
const (
	MaxNodeNameLen = names.MaxNode // node names: [A-Za-z0-9_-]
	MaxNameLen     = names.MaxKey  // modules, keys, resources, providers
	MaxValueLen    = 64 * 1024     // setting, override, identity and credential values
)

// ValidateNodeName checks a node's mesh name: 1 to 64 bytes of
// [A-Za-z0-9_-], which is safe as an AMQP exchange name and a NATS token.
func ValidateNodeName(name string) error { return nameError(names.Node(name)) }

// ValidateModuleName checks a module name: 1 to 128 bytes of
// [A-Za-z0-9_.-], starting with a letter or digit.
func ValidateModuleName(name string) error { return nameError(names.Module(name)) }

// ValidateSettingKey checks a mesh setting key such as "broker.url": 1 to
// 128 bytes of [a-z0-9_.-], starting with a letter or digit.
func ValidateSettingKey(key string) error { return nameError(names.SettingKey(key)) }

// ValidateOverrideKey checks an override key: 1 to 128 bytes of
// [A-Za-z0-9_.-], starting with a letter or digit.
func ValidateOverrideKey(key string) error { return nameError(names.OverrideKey(key)) }

// ValidateResourceName checks a grant's resource or provider name (field
// is "resource" or "provider"): 1 to 128 bytes of [A-Za-z0-9_.:/@-],
// starting with a letter or digit.
func ValidateResourceName(field, name string) error {
	if field == "provider" {
		return nameError(names.Provider(name))
	}
	return nameError(names.Resource(name))
}

// ValidatePublicName checks a node's optional public (DNS) name: empty, or
// at most 253 bytes of dot-separated labels, each 1 to 63 bytes of
// [A-Za-z0-9-] neither starting nor ending with '-'.
func ValidatePublicName(name string) error {
	if name == "" {
		return nil
	}
	return nameError(names.PublicName(name))
}

// nameError turns a rejection of package names into a *NameError (nil
// stays nil).
func nameError(err error) error {
	var ne *names.Error
	if !errors.As(err, &ne) {
		return err
	}
	return &NameError{Field: ne.Kind.String(), Value: ne.Name, Reason: ne.Reason, Err: ne}
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

// ValidateBrokerURL checks the broker.url setting: one amqp:// or amqps://
// URL, or several separated by commas (the nodes of a RabbitMQ cluster,
// internal/brokerurl), each with a host and without a password (settings
// hold no secrets), all naming the same vhost.
func ValidateBrokerURL(raw string) error {
	urls := brokerurl.Split(raw)
	if len(urls) == 0 {
		return &NameError{Field: "broker URL", Value: "", Reason: "is empty"}
	}
	var vhost string
	for i, u := range urls {
		if u == "" {
			return &NameError{Field: "broker URL", Value: RedactURL(raw),
				Reason: fmt.Sprintf("URL %d of %d is empty (URLs are separated by single commas)", i+1, len(urls))}
		}
		if err := validateOneBrokerURL(u); err != nil {
			return err
		}
		p, _ := url.Parse(u)
		if i > 0 && p.Path != vhost {
			return &NameError{Field: "broker URL", Value: RedactURL(u),
				Reason: fmt.Sprintf("names vhost %q, the first URL %q: the brokers of a list are the nodes of one cluster, with one vhost", p.Path, vhost)}
		}
		vhost = p.Path
	}
	return nil
}

func validateOneBrokerURL(raw string) error {
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
	if _, has := u.User.Password(); has {
		return &NameError{Field: "broker URL", Value: RedactURL(raw),
			Reason: "holds a password: broker.url names only where the broker is (host, port, vhost, TLS); each node's own broker credential is made by meshbox mesh node add"}
	}
	return nil
}

// RedactURL returns raw with any password in it hidden (package
// redact).
func RedactURL(raw string) string { return redact.URL(raw) }

// looksSecret reports whether a setting or override key names a secret.
func looksSecret(key string) bool { return redact.Key(key) }

// displayValue renders a setting or override value for logs and reports:
// secret-looking keys are redacted, URL passwords masked, long values cut.
func displayValue(key, v string) string {
	if looksSecret(key) {
		return redacted
	}
	v = redact.Text(v)
	if len(v) > 120 {
		v = v[:120] + "..."
	}
	return v
}
