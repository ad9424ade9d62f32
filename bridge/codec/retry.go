package codec

import (
	"strconv"
	"strings"
	"time"

	"github.com/meshbox/meshbox/internal/names"
)

// StampTime formats a failure's time in the node headers.
func StampTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

// commandHeader reads one of the node headers a command carries (see
// above); anything else in the Meshbox-* namespace is ignored.
func (e *Envelope) commandHeader(k, v string) error {
	switch {
	case strings.EqualFold(k, HeaderAttempts):
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > MaxRetryAttempts {
			return Bad("header %s: %q is not a number of attempts", k, v)
		}
		e.Retry.failed = n
	case strings.EqualFold(k, HeaderFirstFail):
		e.Retry.FirstFail = v
	case strings.EqualFold(k, HeaderLastFail):
		e.Retry.LastFail = v
	case strings.EqualFold(k, HeaderLastReason):
		e.Retry.LastReason = v
	case strings.EqualFold(k, HeaderLastReasonSealed):
		e.Retry.LastReasonSealed = v
	case strings.EqualFold(k, HeaderReplayedSealed):
		e.Retry.ReplayedSealed = v
	case strings.EqualFold(k, HeaderFirstOrigin):
		if !ValidNodeName(v) {
			return Bad("header %s: %q is not a node name", k, v)
		}
		e.Retry.FirstOrigin = v
	case strings.EqualFold(k, HeaderReplayed):
		e.Retry.Replayed = v
	case strings.EqualFold(k, HeaderResultTopic):
		if err := names.Topic(v); err != nil {
			return Bad("header %s: %v", k, err)
		}
		e.ResultTopic = v
	}
	return nil
}

// MaxRetryAttempts bounds the attempts of a stage's retry policy.
const MaxRetryAttempts = 1000
