// Package redact is the one home of how meshbox hides secrets in what it
// prints: logs, the status, reports, `meshbox cache show` and `cache
// diff`, doctor. It hides
//
//   - the password in a URL's user information (postgres://u:PASSWORD@h),
//   - the values of secret-looking query parameters (?password=…,
//     ?access_token=…),
//   - the values of secret-looking keys (a setting or override named
//     "smtp_password", a log attribute named "token"),
//
// and replaces each with Mask. A value it cannot parse is left as it is
// unless it might hold a secret the rules above name (Text looks for
// URLs inside free text). What is not a secret stays readable: user
// names, hosts, ports, paths.
//
// This package imports only the standard library.
package redact

import (
	"net/url"
	"strings"
)

// Mask replaces a hidden value.
const Mask = "xxxxx"

// secretWords mark keys and query parameters whose values are secrets.
var secretWords = []string{
	"password", "passwd", "pwd", "passphrase", "secret", "token", "credential",
	"private", "apikey", "api_key", "api-key", "auth", "signature", "seed",
}

// Key reports whether key (a setting, override, header, query parameter or
// log attribute name) names a secret. Case does not matter.
func Key(key string) bool {
	k := strings.ToLower(key)
	for _, w := range secretWords {
		if strings.Contains(k, w) {
			return true
		}
	}
	return k == "sig" || k == "pass"
}

// URL returns raw with the password of its user information and the
// values of its secret-looking query parameters replaced by Mask. A value
// without "://" goes through Text; one that does not parse as a URL has
// whatever stands between "scheme://user:" and "@" masked. Several URLs
// separated by commas (a broker setting naming the nodes of a cluster)
// are redacted each.
func URL(raw string) string {
	if !strings.Contains(raw, "://") {
		return Text(raw)
	}
	if strings.Count(raw, "://") > 1 && strings.Contains(raw, ",") {
		parts := strings.Split(raw, ",")
		for i, p := range parts {
			parts[i] = URL(p)
		}
		return strings.Join(parts, ",")
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return maskUserinfo(raw)
	}
	changed := false
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), Mask)
		changed = true
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return maskUserinfo(raw)
		}
		for k, vs := range q {
			if Key(k) {
				for i := range vs {
					vs[i] = Mask
				}
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	if !changed {
		return raw
	}
	return u.String()
}

// Value returns v as it may be shown for key: Mask when key names a
// secret (and v is not empty), else v with the secrets of any URL in it
// hidden (Text).
func Value(key, v string) string {
	if v == "" {
		return v
	}
	if Key(key) {
		return Mask
	}
	return Text(v)
}

// Text hides the secrets of every URL in free text s (an error message, a
// log line): each whitespace- or quote-delimited word that holds "://"
// goes through URL. Text without "://" is returned as it is.
func Text(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	var b strings.Builder
	start := -1
	flush := func(end int) {
		if start < 0 {
			return
		}
		w := s[start:end]
		if strings.Contains(w, "://") {
			w = URL(w)
		}
		b.WriteString(w)
		start = -1
	}
	for i := 0; i < len(s); i++ {
		if isDelim(s[i]) {
			flush(i)
			b.WriteByte(s[i])
			continue
		}
		if start < 0 {
			start = i
		}
	}
	flush(len(s))
	return b.String()
}

// maskUserinfo masks the password of a URL that does not parse: what
// stands between the first ':' after "://" and the last '@' before the
// host's end. Without both, the text is kept (it holds no user
// information that could be a password).
func maskUserinfo(raw string) string {
	i := strings.Index(raw, "://")
	if i < 0 {
		return raw
	}
	rest := raw[i+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return raw
	}
	colon := strings.Index(rest[:at], ":")
	if colon < 0 {
		return raw
	}
	return raw[:i+3] + rest[:colon+1] + Mask + rest[at:]
}

func isDelim(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '"', '\'', '`', '<', '>', '(', ')', ',', ';':
		return true
	}
	return false
}
