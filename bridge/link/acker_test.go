package link

import (
	"slices"
	"testing"
)

func TestAckPlan(t *testing.T) {
	ack := func(tags ...uint64) []ackReq {
		var r []ackReq
		for _, tag := range tags {
			r = append(r, ackReq{tag: tag, op: OpAck})
		}
		return r
	}
	requeue := func(tag uint64) ackReq { return ackReq{tag: tag, op: OpRequeue} }
	type step struct {
		reqs        []ackReq
		wantRequeue []uint64
		wantUpTo    uint64
		wantSingle  []uint64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"in order", []step{{ack(1, 2, 3), nil, 3, nil}, {ack(4), nil, 4, nil}}},
		{"gap held: later ones singly", []step{
			{ack(2, 3), nil, 0, []uint64{2, 3}},
			{ack(1), nil, 1, nil},         // 1 completes the run up to 3; 2 and 3 were acked already
			{ack(5), nil, 0, []uint64{5}}, // 4 outstanding
			{ack(4, 6), nil, 6, nil},      // run 4..6; 5 already settled, 6 acked by the multiple ack
		}},
		{"requeue in the run", []step{
			{[]ackReq{requeue(1), {tag: 2, op: OpAck}}, []uint64{1}, 2, nil},
			{[]ackReq{{tag: 3, op: OpAck}, requeue(4)}, []uint64{4}, 3, nil},
			{ack(5), nil, 5, nil},
		}},
		{"never twice", []step{
			{ack(1), nil, 1, nil},
			{ack(1), nil, 0, nil},
			{ack(3), nil, 0, []uint64{3}},
			{ack(3), nil, 0, nil},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a ackBook
			for i, st := range tt.steps {
				rq, upTo, single := a.plan(st.reqs)
				if !slices.Equal(rq, st.wantRequeue) || upTo != st.wantUpTo || !slices.Equal(single, st.wantSingle) {
					t.Fatalf("step %d: got requeue %v, multiple up to %d, single %v; want %v, %d, %v",
						i, rq, upTo, single, st.wantRequeue, st.wantUpTo, st.wantSingle)
				}
			}
		})
	}
}
