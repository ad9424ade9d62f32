package appliance

import (
	"bytes"
	"crypto/sha256"
	_ "embed" // the status page is compiled into the binary
	"encoding/base64"
	"net/http"
	"strings"
)

// statusPage is the HTML status page served at "/". It is self-contained
// (inline style and script, no asset from anywhere else) and draws itself
// from GET /status, so the page and the JSON never disagree.
//
//go:embed statuspage.html
var statusPage []byte

// statusPageCSP is the Content-Security-Policy of the status page: nothing
// but the page's own inline style and script (pinned by their hashes) and
// requests to the node itself.
var statusPageCSP = buildStatusPageCSP(statusPage)

// serveStatusPage writes the status page.
func (a *Appliance) serveStatusPage(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", statusPageCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(statusPage) // the client may have gone
}

// buildStatusPageCSP returns a policy that allows exactly the inline
// <style> and <script> blocks of page, by their SHA-256 hashes.
func buildStatusPageCSP(page []byte) string {
	styles := inlineHashes(page, "<style>", "</style>")
	scripts := inlineHashes(page, "<script>", "</script>")
	return "default-src 'none'; connect-src 'self'; img-src 'self' data:; " +
		"style-src " + strings.Join(styles, " ") + "; " +
		"script-src " + strings.Join(scripts, " ") + "; " +
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}

// inlineHashes returns the CSP source expression ('sha256-...') of the
// content of every open...close block in page.
func inlineHashes(page []byte, open, close string) []string {
	var out []string
	rest := page
	for {
		i := bytes.Index(rest, []byte(open))
		if i < 0 {
			break
		}
		rest = rest[i+len(open):]
		j := bytes.Index(rest, []byte(close))
		if j < 0 {
			break
		}
		sum := sha256.Sum256(rest[:j])
		out = append(out, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
		rest = rest[j+len(close):]
	}
	if len(out) == 0 {
		return []string{"'none'"}
	}
	return out
}
