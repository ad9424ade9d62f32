package meshtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/meshbox/meshbox/appliance"
)

// Status reads the status of the node whose HTTP listener is at httpURL
// (GET /status: Process.HTTPURL) into the node's own type. The test fails
// if the node does not answer with its status.
func Status(tb testing.TB, httpURL string) appliance.Status {
	tb.Helper()
	st, _, err := readStatus(httpURL)
	if err != nil {
		tb.Fatalf("meshtest: %v", err)
	}
	return st
}

// WaitStatus reads the status of the node at httpURL until ok accepts it,
// and returns that status. When ok does not within d, the test fails
// with what (the state waited for) and the last status read; when the
// node does not answer with its status, at once.
func WaitStatus(tb testing.TB, httpURL string, d time.Duration, what string, ok func(appliance.Status) bool) appliance.Status {
	tb.Helper()
	var st appliance.Status
	var body []byte
	var err error
	held := Poll(d, func() bool {
		st, body, err = readStatus(httpURL)
		return err != nil || ok(st)
	})
	switch {
	case err != nil:
		tb.Fatalf("meshtest: waiting for %s: %v", what, err)
	case !held:
		tb.Fatalf("meshtest: %s: not within %v; last status of %s: %s", what, d, httpURL, body)
	}
	return st
}

// readStatus returns the status at httpURL, decoded and as it came.
func readStatus(httpURL string) (appliance.Status, []byte, error) {
	var st appliance.Status
	resp, err := http.Get(httpURL + "/status")
	if err != nil {
		return st, nil, fmt.Errorf("GET %s/status: %w", httpURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return st, nil, fmt.Errorf("GET %s/status: %w", httpURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return st, body, fmt.Errorf("GET %s/status: %s: %s", httpURL, resp.Status, body)
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, body, fmt.Errorf("GET %s/status: not a node's status: %w\n%s", httpURL, err, body)
	}
	return st, body, nil
}
