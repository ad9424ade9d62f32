package brokeradmin

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
)

// A queue read while a consumer's channel closes (channel_details [] in
// place of an object, which the client cannot decode) is read again; a
// queue that cannot be read that way for good is an error.
func TestGetQueueWhileAChannelCloses(t *testing.T) {
	const closing = `{"name":"q","messages":0,"consumers":1,"consumer_details":[{"consumer_tag":"t","channel_details":[]}]}`
	const settled = `{"name":"q","messages":0,"consumers":0,"consumer_details":[]}`
	var reads, badReads atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		n := reads.Add(1)
		if n <= badReads.Load() {
			_, _ = w.Write([]byte(closing))
			return
		}
		_, _ = w.Write([]byte(settled))
	}))
	defer srv.Close()
	c, err := rabbithole.NewClient(srv.URL, "admin", "secret")
	if err != nil {
		t.Fatal(err)
	}
	a := &Admin{c: c, endpoint: srv.URL, user: "admin", vhost: "mesh"}

	badReads.Store(2)
	info, err := a.getQueue("mesh", "q")
	if err != nil || info.Name != "q" || info.Consumers != 0 {
		t.Fatalf("two reads during a channel's close, then a settled one: got %+v, %v; want the settled queue", info, err)
	}
	if got := reads.Load(); got != 3 {
		t.Errorf("reads: got %d, want 3", got)
	}

	reads.Store(0)
	badReads.Store(100)
	if _, err := a.getQueue("mesh", "q"); err == nil {
		t.Fatal("a queue that never decodes: got no error")
	}
	if got := reads.Load(); got != 5 {
		t.Errorf("reads of a queue that never decodes: got %d, want 5", got)
	}
}
