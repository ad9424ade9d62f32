package rows

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/internal/wire"
)

// The rows API on the node's NATS server: requests on
// $MESH.rows.<table>.<op> with a JSON body, answered in JSON or with a
// NATS micro error (Nats-Service-Error, Nats-Service-Error-Code: 400 bad
// input, 404 no such table or row, 503 no key to seal the table with,
// 500 the store failed); every change a node applies, its own writes and
// those read from the log, is published on
// $MESH.rows.<table>.changed.<row>.
const (
	subjectRoot = wire.SubjectRowsPrefix

	OpPut     = "put"     // {"row", "set": {field: value}, "delete": [field]} -> Written
	OpPutMany = "putmany" // {"rows": [{"row", "set", "delete"}, ...]} -> WrittenRows
	OpDelete  = "delete"  // {"row"} (every field) -> Written
	OpGet     = "get"     // {"row"} -> RowDoc
	OpList    = "list"    // {"prefix", "after", "limit"} -> ListDoc
	OpHistory = "history" // {"row", "field"} -> HistoryDoc
)

// ReadOps and WriteOps are the operations the read and write rights of a
// program give.
var (
	ReadOps  = []string{OpGet, OpList, OpHistory}
	WriteOps = []string{OpPut, OpPutMany, OpDelete}
)

// Subject is the request subject of op on table ("*": every table).
func Subject(table, op string) string { return subjectRoot + table + "." + op }

// ChangedSubject is the subject changes of row of table are published on
// (row may be a wildcard).
func ChangedSubject(table, row string) string { return subjectRoot + table + ".changed." + row }

// Request is the body of every request; each operation reads its part.
type Request struct {
	Row    string            `json:"row,omitempty"`
	Field  string            `json:"field,omitempty"`
	Set    map[string]string `json:"set,omitempty"`
	Delete []string          `json:"delete,omitempty"`
	Prefix string            `json:"prefix,omitempty"`
	// After: a list starts after this row key (the last of the page
	// before, when it said more).
	After string `json:"after,omitempty"`
	Limit int    `json:"limit,omitempty"`
	// Rows are a putmany's writes, at most MaxPutMany.
	Rows []RowPut `json:"rows,omitempty"`
}

// RowPut is one row's write of a putmany: what a put's body says.
type RowPut struct {
	Row    string            `json:"row"`
	Set    map[string]string `json:"set,omitempty"`
	Delete []string          `json:"delete,omitempty"`
}

// Written answers a put or a delete: the write is committed on this node.
type Written struct {
	Table string `json:"table"`
	Row   string `json:"row"`
	Stamp string `json:"stamp"`
	Node  string `json:"node"`
}

// WrittenRows answers a putmany: every row is committed on this node,
// each with its stamp, in the order of the request.
type WrittenRows struct {
	Table string     `json:"table"`
	Node  string     `json:"node"`
	Rows  []RowStamp `json:"rows"`
}

// RowStamp is a row's write and its stamp.
type RowStamp struct {
	Row   string `json:"row"`
	Stamp string `json:"stamp"`
}

// Version is a field's version.
type Version struct {
	Value   string    `json:"value,omitempty"`
	Deleted bool      `json:"deleted,omitempty"`
	Stamp   string    `json:"stamp"`
	At      time.Time `json:"at"`
	Node    string    `json:"node"`
}

// RowDoc is a row: its fields that are not deleted, and every field's
// version.
type RowDoc struct {
	Table    string             `json:"table"`
	Row      string             `json:"row"`
	Fields   map[string]string  `json:"fields"`
	Versions map[string]Version `json:"versions"`
}

// ListDoc is a page of rows. More: rows follow (the next page starts
// after the last row of this one); a page holds at most the request's
// limit of rows, and no more than the node's NATS server carries in one
// message.
type ListDoc struct {
	Table string   `json:"table"`
	Rows  []RowDoc `json:"rows"`
	More  bool     `json:"more"`
}

// HistoryDoc is the versions of a field this node holds, newest first.
type HistoryDoc struct {
	Table    string    `json:"table"`
	Row      string    `json:"row"`
	Field    string    `json:"field"`
	Versions []Version `json:"versions"`
}

// ChangedDoc is published on ChangedSubject for each change applied.
type ChangedDoc struct {
	Table    string             `json:"table"`
	Row      string             `json:"row"`
	Fields   map[string]string  `json:"fields,omitempty"`
	Deleted  []string           `json:"deleted,omitempty"`
	Versions map[string]Version `json:"versions"`
}

// DefaultListLimit and MaxListLimit bound a list's page.
const (
	DefaultListLimit = 100
	MaxListLimit     = 10000
)

func version(c Cell) Version {
	v := Version{Deleted: c.Deleted, Stamp: c.Stamp.String(), At: c.Stamp.Wall().UTC(), Node: c.Node}
	if !c.Deleted {
		v.Value = string(c.Value)
	}
	return v
}

func rowDoc(table, row string, cells map[string]Cell) RowDoc {
	d := RowDoc{Table: table, Row: row, Fields: map[string]string{}, Versions: map[string]Version{}}
	for f, c := range cells {
		d.Versions[f] = version(c)
		if !c.Deleted {
			d.Fields[f] = string(c.Value)
		}
	}
	return d
}

// ServeConfig is where the API is served.
type ServeConfig struct {
	// Conn receives the requests and publishes the changes: a connection
	// of the node's own.
	Conn *nats.Conn
	// Replies, when set, carries the answers (the node's responder).
	Replies *nats.Conn
	// ReplyAllowed says whether a request on subject may be answered at
	// reply: a reply subject is the caller's word, and the node must not
	// publish where the caller may not (a program asking for a row with
	// the reply subject cmd.<stage> would submit a command as the node).
	// A request it refuses is not acted on. Nil: every reply is allowed.
	ReplyAllowed func(subject, reply string) error
	// Interest, when set, says whether anyone subscribes to a subject: a
	// change no one watches is not encoded and published. Nil: every
	// change is published.
	Interest func(subject string) bool
	// ReadOnly, when set, says why the API may not write table (nil: it
	// may): a table the node writes from another source of its own (the
	// MQTT retained state) is read here, never written. A write it
	// refuses is answered 403.
	ReadOnly func(table string) error
}

// Serve answers the rows API until the connection closes, and publishes
// every change. It returns once the server has the subscription: a
// request made after it is answered. Programs' rights on the subjects are
// their permissions' business; their reply subjects are checked here.
func (e *Engine) Serve(sc ServeConfig) (*nats.Subscription, error) {
	nc := sc.Conn
	replies := sc.Replies
	if replies == nil {
		replies = nc
	}
	var refusedOnce sync.Map
	e.OnChange(func(a Applied) {
		subject := ChangedSubject(a.Table, a.Row)
		if sc.Interest != nil && !sc.Interest(subject) {
			return
		}
		d := ChangedDoc{Table: a.Table, Row: a.Row, Fields: map[string]string{}, Versions: map[string]Version{}}
		for f, c := range a.Won() {
			d.Versions[f] = version(c)
			if c.Deleted {
				d.Deleted = append(d.Deleted, f)
			} else {
				d.Fields[f] = string(c.Value)
			}
		}
		b, _ := json.Marshal(d)
		_ = nc.Publish(subject, b)
	})
	// Writes run beside each other (at most maxWriting at once), so that
	// concurrent writers share the disk's commits; reads run in turn.
	writing := make(chan struct{}, maxWriting)
	sub, err := nc.Subscribe(subjectRoot+"*.*", func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		if op := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]; op == OpPut || op == OpPutMany || op == OpDelete {
			writing <- struct{}{}
			e.writes.Add(1)
			go func() { // ends with its write
				defer func() {
					<-writing
					e.writes.Done()
				}()
				e.serveOne(m, sc, replies, &refusedOnce)
			}()
			return
		}
		e.serveOne(m, sc, replies, &refusedOnce)
	})
	if err != nil {
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("rows: subscribe to the API: %w", err)
	}
	return sub, nil
}

// maxWriting bounds the writes of the API in progress at once.
const maxWriting = 256

// serveOne answers one request.
func (e *Engine) serveOne(m *nats.Msg, sc ServeConfig, replies *nats.Conn, refusedOnce *sync.Map) {
	if sc.ReplyAllowed != nil {
		if err := sc.ReplyAllowed(m.Subject, m.Reply); err != nil {
			e.m.errors.WithLabelValues("reply_refused").Inc()
			if _, seen := refusedOnce.LoadOrStore(m.Subject, true); !seen {
				e.log.Warn("rows request refused: its reply subject is not the caller's to receive on (logged once per subject)", "subject", m.Subject, "err", err)
			}
			return
		}
	}
	doc, err := e.checkWritable(m.Subject, sc)
	if err == nil {
		doc, err = e.answer(m.Subject, m.Data, int(replies.MaxPayload()))
	}
	if err != nil {
		r := nats.NewMsg(m.Reply)
		wire.SetError(r.Header, errorCode(err), err.Error())
		_ = replies.PublishMsg(r)
		return
	}
	b, _ := json.Marshal(doc)
	_ = replies.Publish(m.Reply, b)
}

// checkWritable refuses a write of the API to a table that sc's ReadOnly
// names, counted, and logged once per table.
func (e *Engine) checkWritable(subject string, sc ServeConfig) (any, error) {
	if sc.ReadOnly == nil {
		return nil, nil
	}
	table, op, _ := strings.Cut(strings.TrimPrefix(subject, subjectRoot), ".")
	if op != OpPut && op != OpPutMany && op != OpDelete {
		return nil, nil
	}
	err := sc.ReadOnly(table)
	if err == nil {
		return nil, nil
	}
	e.m.errors.WithLabelValues("read_only").Inc()
	if _, seen := e.readOnlyLogged.LoadOrStore(table, true); !seen {
		e.log.Warn("a write of the rows API refused: the table is written by the node alone (logged once per table)", "table", table, "err", err)
	}
	return nil, fmt.Errorf("%w: table %s: %v", ErrReadOnly, table, err)
}

func errorCode(err error) int {
	switch {
	case errors.Is(err, ErrReadOnly):
		return wire.CodeForbidden
	case errors.Is(err, ErrBadInput):
		return 400
	case errors.Is(err, ErrNoTable), errors.Is(err, ErrNoRow):
		return 404
	case errors.Is(err, ErrNoKey):
		return 503
	}
	return 500
}

// answer runs one request on subject; its answer must fit in maxBytes
// (0: no bound).
func (e *Engine) answer(subject string, body []byte, maxBytes int) (any, error) {
	rest := strings.TrimPrefix(subject, subjectRoot)
	table, op, _ := strings.Cut(rest, ".")
	var req Request
	if len(body) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, fmt.Errorf("%w: the request is not a JSON object of the rows API: %v", ErrBadInput, err)
		}
	}
	switch op {
	case OpPut:
		set := map[string][]byte{}
		for f, v := range req.Set {
			set[f] = []byte(v)
		}
		st, err := e.Put(table, req.Row, set, req.Delete)
		if err != nil {
			return nil, err
		}
		return Written{Table: table, Row: req.Row, Stamp: st.String(), Node: e.cfg.Node}, nil
	case OpPutMany:
		// The answer must fit in one message: it is checked before the
		// rows are written.
		size := 64 + len(table) + len(e.cfg.Node)
		writes := make([]RowWrite, len(req.Rows))
		for i, r := range req.Rows {
			w := RowWrite{Row: r.Row, Delete: r.Delete, Set: make(map[string][]byte, len(r.Set))}
			for f, v := range r.Set {
				w.Set[f] = []byte(v)
			}
			writes[i] = w
			size += len(r.Row) + 64
		}
		if maxBytes > 0 && size > maxBytes {
			return nil, fmt.Errorf("%w: the answer to %d rows would not fit in a message of this node (%d bytes): send fewer rows a request", ErrBadInput, len(req.Rows), maxBytes)
		}
		stamps, err := e.PutMany(table, writes)
		if err != nil {
			return nil, err
		}
		doc := WrittenRows{Table: table, Node: e.cfg.Node, Rows: make([]RowStamp, len(stamps))}
		for i, st := range stamps {
			doc.Rows[i] = RowStamp{Row: req.Rows[i].Row, Stamp: st.String()}
		}
		return doc, nil
	case OpDelete:
		st, err := e.DeleteRow(table, req.Row)
		if err != nil {
			return nil, err
		}
		return Written{Table: table, Row: req.Row, Stamp: st.String(), Node: e.cfg.Node}, nil
	case OpGet:
		cells, err := e.Get(table, req.Row)
		if err != nil {
			return nil, err
		}
		return rowDoc(table, req.Row, cells), nil
	case OpList:
		limit := req.Limit
		if limit <= 0 {
			limit = DefaultListLimit
		}
		if limit > MaxListLimit {
			return nil, fmt.Errorf("%w: limit %d, at most %d", ErrBadInput, limit, MaxListLimit)
		}
		doc := ListDoc{Table: table, Rows: []RowDoc{}}
		// An answer past the server's largest message is never
		// delivered: the page ends before it.
		size := 256 + len(table)
		err := e.ListAfter(table, req.Prefix, req.After, func(row string, cells map[string]Cell) bool {
			if len(doc.Rows) == limit {
				doc.More = true
				return false
			}
			d := rowDoc(table, row, cells)
			if maxBytes > 0 {
				b, _ := json.Marshal(d)
				if size+len(b)+1 > maxBytes && len(doc.Rows) > 0 {
					doc.More = true
					return false
				}
				size += len(b) + 1
			}
			doc.Rows = append(doc.Rows, d)
			return true
		})
		return doc, err
	case OpHistory:
		cells, err := e.History(table, req.Row, req.Field)
		if err != nil {
			return nil, err
		}
		doc := HistoryDoc{Table: table, Row: req.Row, Field: req.Field, Versions: []Version{}}
		for _, c := range cells {
			doc.Versions = append(doc.Versions, version(c))
		}
		return doc, nil
	}
	return nil, fmt.Errorf("%w: %q is not an operation of the rows API (put, putmany, delete, get, list, history)", ErrBadInput, op)
}
