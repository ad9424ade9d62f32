// Package hoptrace names the points of a request's round trip across the
// mesh, for the request-hops benchmark: a build with the hoptrace tag
// records when the last request passed each (Marks); without it, Mark
// does nothing and costs nothing.
package hoptrace

// Hop names a point of a request's round trip.
type Hop int

// The points of a round trip, in order. The caller's and the host's own
// points are marked by the benchmark's programs.
const (
	HopCallerSent     Hop = iota // the caller's program sends the request
	HopStandIn                   // node A's stand-in has it
	HopRequestWritten            // node A handed it to the AMQP library
	HopRequestTaken              // node B's bridge took it off its queue
	HopHostAsked                 // node B's bridge hands it to the local host
	HopHostHas                   // the host's program has it
	HopHostAnswered              // node B's bridge has the host's reply
	HopReplyWritten              // node B handed the reply to the AMQP library
	HopReplyTaken                // node A's bridge took the reply off its queue
	HopCallerAnswered            // node A's bridge answered the caller
	HopCallerHas                 // the caller's program has the reply
	HopCount                     // the number of points
)
