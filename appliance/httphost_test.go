package appliance

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestHostGuard(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	for _, tt := range []struct {
		listen string
		extra  []string
		host   string
		want   int
	}{
		{"127.0.0.1:7222", nil, "127.0.0.1:7222", 200},
		{"127.0.0.1:7222", nil, "localhost:7222", 200},
		{"127.0.0.1:7222", nil, "LOCALHOST", 200},
		{"127.0.0.1:7222", nil, "[::1]:7222", 200},
		{"127.0.0.1:7222", nil, "127.0.0.2", 200},
		{"127.0.0.1:7222", nil, "evil.example", 421},
		{"127.0.0.1:7222", nil, "evil.example:7222", 421},
		{"127.0.0.1:7222", nil, "192.168.1.5:7222", 421},
		{"127.0.0.1:7222", nil, "", 421},
		{"192.168.1.5:7222", nil, "192.168.1.5:7222", 200},
		{"192.168.1.5:7222", nil, "192.168.1.6:7222", 421},
		{"0.0.0.0:7222", nil, "192.168.1.6:7222", 200},
		{"0.0.0.0:7222", nil, "attic.lan:7222", 421},
		{"0.0.0.0:7222", []string{"attic.lan"}, "attic.lan:7222", 200},
		{"0.0.0.0:7222", []string{"Status.Example.org."}, "status.example.org", 200},
		{"attic.lan:7222", nil, "attic.lan:7222", 200},
	} {
		g := newHostGuard(tt.listen, tt.extra, ok)
		r := httptest.NewRequest("GET", "/status", nil)
		r.Host = tt.host
		w := httptest.NewRecorder()
		g.ServeHTTP(w, r)
		if w.Code != tt.want {
			t.Errorf("listen %s %v, Host %q: got %d, want %d", tt.listen, tt.extra, tt.host, w.Code, tt.want)
		}
	}
}

// A running node refuses a request with a foreign Host (DNS rebinding).
func TestHTTPRefusesForeignHost(t *testing.T) {
	a := startNode(t, "alpha", t.TempDir())
	for host, want := range map[string]int{"evil.example": http.StatusMisdirectedRequest, "": http.StatusOK} {
		req, err := http.NewRequest("GET", a.HTTPURL()+"/status", nil)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %q: got %d, want %d", host, resp.StatusCode, want)
		}
	}
}
