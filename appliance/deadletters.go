package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/wire"
)

// SubjectDeadLetters takes a DeadLetterRequest and answers a
// DeadLetterReply: the node's API behind `meshbox dlq`. The node reaches
// the broker with its own broker user, so it acts on the dead letters of
// the stages the mesh allows it.
const SubjectDeadLetters = wire.SubjectDeadLetters

// Actions of a DeadLetterRequest.
const (
	DeadLetterList   = "list"
	DeadLetterShow   = "show"
	DeadLetterReplay = "replay"
	DeadLetterPurge  = "purge"
)

// DeadLetterRequest asks something of the dead letters of a stage.
type DeadLetterRequest struct {
	Action string `json:"action"`
	// Stage is the stage; "" with list: every stage hosted here.
	Stage string `json:"stage,omitempty"`
	// ID is a dead letter's message id (show; replay unless All).
	ID  string `json:"id,omitempty"`
	All bool   `json:"all,omitempty"` // replay: every dead letter of Stage
}

// DeadLetterReply answers a DeadLetterRequest.
type DeadLetterReply struct {
	Error   string              `json:"error,omitempty"`
	Letters []bridge.DeadLetter `json:"letters,omitempty"` // list, show (one)
	Count   int                 `json:"count"`             // replay, purge: how many
}

// deadLetterTimeout bounds one dead-letter operation at the node.
const deadLetterTimeout = 60 * time.Second

// check validates r.
func (r DeadLetterRequest) check() error {
	switch r.Action {
	case DeadLetterList, DeadLetterShow, DeadLetterReplay, DeadLetterPurge:
	default:
		return fmt.Errorf("unknown action %q (list, show, replay or purge)", r.Action)
	}
	if r.Stage != "" || r.Action != DeadLetterList {
		if err := names.Stage(r.Stage); err != nil {
			return err
		}
	}
	switch {
	case r.Action == DeadLetterShow && r.ID == "":
		return fmt.Errorf("show needs a message id")
	case r.Action == DeadLetterReplay && (r.ID == "") == !r.All:
		return fmt.Errorf("replay needs a message id or all, not both")
	case r.ID != "" && r.Action != DeadLetterShow && r.Action != DeadLetterReplay:
		return fmt.Errorf("%s takes no message id", r.Action)
	}
	return nil
}

// serveDeadLetters answers SubjectDeadLetters. a.mu is held.
func (a *Appliance) serveDeadLetters() error {
	_, err := a.parts().nc.Subscribe(SubjectDeadLetters, func(m *nats.Msg) {
		if !a.adminRequest(m) {
			return
		}
		rep := a.answerDeadLetters(m.Data)
		data, _ := json.Marshal(rep) // plain values: cannot fail
		a.respond(m, data)
	})
	if err != nil {
		return fmt.Errorf("serve %s: %w", SubjectDeadLetters, err)
	}
	return nil
}

func (a *Appliance) answerDeadLetters(data []byte) DeadLetterReply {
	var req DeadLetterRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return DeadLetterReply{Error: "bad request: " + err.Error()}
	}
	if err := req.check(); err != nil {
		return DeadLetterReply{Error: err.Error()}
	}
	br := a.parts().bridge
	if br == nil {
		return DeadLetterReply{Error: "this node has no broker link: dead letters live on the broker"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadLetterTimeout)
	defer cancel()
	var rep DeadLetterReply
	var err error
	switch req.Action {
	case DeadLetterList:
		stages := []string{req.Stage}
		switch {
		case req.Stage == "" && br.Standalone():
			stages = []string{""} // every stage's, from the outbox
		case req.Stage == "":
			stages = slices.Sorted(maps.Keys(br.Status().DeadLetters))
		}
		rep.Letters = []bridge.DeadLetter{}
		for _, st := range stages {
			var list []bridge.DeadLetter
			list, err = br.DeadLetters(ctx, st)
			if req.Stage == "" && errors.Is(err, bridge.ErrNoDeadLetters) {
				err = nil // a stage hosted here without a dead-letter queue yet
				continue
			}
			if err != nil {
				break
			}
			rep.Letters = append(rep.Letters, list...)
		}
		rep.Count = len(rep.Letters)
	case DeadLetterShow:
		var dl bridge.DeadLetter
		if dl, err = br.ShowDeadLetter(ctx, req.Stage, req.ID); err == nil {
			rep.Letters, rep.Count = []bridge.DeadLetter{dl}, 1
		}
	case DeadLetterReplay:
		rep.Count, err = br.ReplayDeadLetters(ctx, req.Stage, req.ID)
	case DeadLetterPurge:
		rep.Count, err = br.PurgeDeadLetters(ctx, req.Stage)
	}
	if err != nil {
		rep.Error = err.Error()
	}
	return rep
}
