package outbox

import (
	"testing"
	"time"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/names/namestest"
)

// TestRecordNamesAgree checks that a stored record's name is read back
// exactly when package names accepts it as a capability, stage or topic
// name.
func TestRecordNamesAgree(t *testing.T) {
	for _, s := range namestest.Inputs() {
		checkRecordName(t, s)
	}
}

// FuzzRecordNames checks the record decoder's names against package names
// for any input.
func FuzzRecordNames(f *testing.F) {
	for _, s := range namestest.Inputs() {
		f.Add(s)
	}
	f.Fuzz(checkRecordName)
}

func checkRecordName(t *testing.T, s string) {
	t.Helper()
	want := names.Capability(s) == nil
	for _, kind := range []Kind{Command, Event, Local} {
		_, err := decodeRecord(1, (&Record{Kind: kind, Created: time.Unix(1, 0), Name: s, MsgID: "id"}).Encode())
		if got := err == nil; got != want {
			t.Fatalf("name of an outbox record %q: outbox says valid=%v, package names says %v", s, got, want)
		}
	}
}
