package codec

import (
	"time"
)

const (
	// EventQueueExpiry deletes the event queue of a node unused this long.
	EventQueueExpiry = 7 * 24 * time.Hour
)
