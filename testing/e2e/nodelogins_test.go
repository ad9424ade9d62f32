package e2e

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/meshbox/meshbox/cache/meshdb"
	"github.com/meshbox/meshbox/internal/seal"
)

// The mesh database keeps a node's passwords only sealed: to act with a
// node's real credential, a test reads it as the node does, with what the
// node holds. nodeLogins remembers that per mesh database and node: the
// database URL of its join token (cliEnv records it from the output of
// mesh node add and rejoin) and its data directory, where its key pair is,
// once it runs (joinedNodeEnv).
var nodeLogins sync.Map // dbURL + "\x00" + node -> *nodeLogin

type nodeLogin struct {
	mu      sync.Mutex
	url     string // from the node's newest join token
	dataDir string
}

func loginOf(db, node string) *nodeLogin {
	l, _ := nodeLogins.LoadOrStore(db+"\x00"+node, &nodeLogin{})
	return l.(*nodeLogin)
}

// rememberJoin records the join token in the output of a `meshbox mesh
// node add` or `rejoin` run with env.
func rememberJoin(env []string, out string) {
	var db string
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "MESHBOX_DB="); ok {
			db = v
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if tok, err := meshdb.ParseJoinToken(line); err == nil && db != "" {
			l := loginOf(db, tok.Node)
			l.mu.Lock()
			l.url = tok.DB
			l.mu.Unlock()
		}
	}
}

// rememberDataDir records where node of the mesh at db keeps its data.
func rememberDataDir(db, node, dir string) {
	l := loginOf(db, node)
	l.mu.Lock()
	l.dataDir = dir
	l.mu.Unlock()
}

// nodeCredential returns node's newest broker user and password as the
// node itself reads them: with its join token's login (which opens a
// generation handed out with the token) or, once that role is gone, as
// the admin with the node's key (which opens a rotated one).
func nodeCredential(t *testing.T, ctx context.Context, db, node string) (user, password string) {
	t.Helper()
	l := loginOf(db, node)
	l.mu.Lock()
	tokenURL, dataDir := l.url, l.dataDir
	l.mu.Unlock()
	if tokenURL == "" {
		t.Fatalf("no join token of node %s recorded: add it with cliEnv (mesh node add)", node)
	}
	var key *seal.NodeKey
	if dataDir != "" {
		if text, err := os.ReadFile(filepath.Join(dataDir, "node.key")); err == nil {
			if key, err = seal.ParseNodeKey(text); err != nil {
				t.Fatal(err)
			}
		}
	}
	var errs []string
	for _, u := range []string{tokenURL, db} {
		mdb, err := meshdb.Open(ctx, u, meshdb.Options{NodeKey: key})
		if err != nil {
			t.Fatal(err)
		}
		snap, err := mdb.Load(ctx, node)
		mdb.Close()
		if err == nil && snap.Bindings.Broker != nil {
			return snap.Bindings.Broker.User, snap.Bindings.Broker.Password.Reveal()
		}
		errs = append(errs, err.Error())
	}
	t.Fatalf("node %s's credential: %s", node, strings.Join(errs, "; "))
	return "", ""
}

// withCredential returns the AMQP URL vhost with user and password.
func withCredential(t *testing.T, vhost, user, password string) string {
	t.Helper()
	u, err := url.Parse(vhost)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// dumpCredentials is what the database's admin reads of the nodes'
// credentials: every value of every row of node_credentials and
// join_tokens that could be a password (a bytea also decoded, raw and in
// base64), the node roles,
// and the broker users the rows name.
func dumpCredentials(t *testing.T, ctx context.Context, db string) (values, roles, users []string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	seen := map[string]bool{}
	add := func(v string) {
		// A password is 16 characters or more (the generated ones: 43),
		// never a timestamp.
		if _, err := time.Parse(time.RFC3339Nano, v); err == nil || len(v) < 16 {
			return
		}
		if !seen[v] {
			seen[v] = true
			values = append(values, v)
		}
	}
	for _, table := range []string{"node_credentials", "join_tokens"} {
		var rows []string
		if err := queryStrings(ctx, conn, &rows, `SELECT row_to_json(t)::text FROM `+table+` t`); err != nil {
			t.Fatal(err)
		}
		for _, js := range rows {
			var row map[string]any
			if err := json.Unmarshal([]byte(js), &row); err != nil {
				t.Fatal(err)
			}
			for col, v := range row {
				s, ok := v.(string)
				if !ok {
					continue
				}
				add(s)
				if col == "broker_user" {
					users = append(users, s)
				}
				if raw, ok := strings.CutPrefix(s, `\x`); ok { // a bytea, in hex
					if b, err := hex.DecodeString(raw); err == nil {
						add(string(b))
						add(base64.StdEncoding.EncodeToString(b))
					}
				}
			}
		}
	}
	if err := queryStrings(ctx, conn, &roles, `SELECT role FROM node_roles ORDER BY 1`); err != nil {
		t.Fatal(err)
	}
	return values, roles, users
}

// queryStrings appends the first column of each row of query to out.
func queryStrings(ctx context.Context, conn *pgx.Conn, out *[]string, query string) error {
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		*out = append(*out, s)
	}
	return rows.Err()
}

// brokerAccepts reports whether the broker at vhost lets user log in with
// password.
func brokerAccepts(vhost, user, password string) bool {
	u, err := url.Parse(vhost)
	if err != nil {
		return false
	}
	u.User = url.UserPassword(user, password)
	conn, err := amqp.DialConfig(u.String(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// databaseAccepts reports whether the database at db lets role log in
// with password.
func databaseAccepts(ctx context.Context, db, role, password string) bool {
	u, err := url.Parse(db)
	if err != nil {
		return false
	}
	u.User = url.UserPassword(role, password)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, u.String())
	if err != nil {
		return false
	}
	_ = conn.Close(ctx)
	return true
}
