package codec

import (
	"cmp"
	"strconv"

	"github.com/nats-io/nats.go"
)

// SetCommandHeaders sets the headers a handler sees with a command on h.
// The keys are canonical already; the four values share one allocation
// (this runs for every command).
func SetCommandHeaders(h nats.Header, id, origin string, attempt int, redelivered bool) {
	v := [...]string{id, origin, strconv.Itoa(attempt), strconv.FormatBool(redelivered)}
	vs := v[:]
	h[HeaderMsgID] = vs[0:1:1]
	h[HeaderOrigin] = vs[1:2:2]
	h[HeaderAttempt] = vs[2:3:3]
	h[HeaderRedelivered] = vs[3:4:4]
}

// commandMsg builds the NATS message that carries a command delivery to
// the local handler of stage; seen says this node handed the same id out
// before (a possible duplicate the broker did not mark).
func (e *Envelope) CommandMsg(stage string, seen bool) *nats.Msg {
	m := &nats.Msg{Subject: SubjWorkPrefix + stage, Data: e.Body, Header: make(nats.Header, len(e.Header)+4)}
	for k, vs := range e.Header {
		if !ServerHeader(k) { // a peer's word: never the local server's bookkeeping
			m.Header[k] = vs
		}
	}
	SetCommandHeaders(m.Header, e.MsgID, e.Origin, e.Attempt, e.Redelivered || e.Attempt > 1 || seen)
	if e.ResultTopic != "" {
		m.Header[HeaderResultTopic] = []string{e.ResultTopic}
	}
	if r := cmp.Or(e.Retry.ReplayedText, e.Retry.Replayed); r != "" {
		m.Header[HeaderReplayed] = []string{r}
	}
	if e.Retry.FirstOrigin != "" {
		m.Header[HeaderFirstOrigin] = []string{e.Retry.FirstOrigin}
	}
	return m
}
