package bridge

import (
	"errors"
	"time"

	brokerlink "github.com/meshbox/meshbox/bridge/link"

	"github.com/meshbox/meshbox/bridge/codec"

	"github.com/meshbox/meshbox/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Link states, in status and in meshbox_broker_state{state}.
const (
	StateNone       = wire.StateNone
	StateConnecting = wire.StateConnecting
	StateConnected  = wire.StateConnected
	StateOffline    = wire.StateOffline
	StateBlocked    = wire.StateBlocked
)

// Error kinds in meshbox_errors_total{kind}.
const (
	errKindBadInput    = "bad_input"    // a local program sent something invalid (400)
	errKindForbidden   = "forbidden"    // a local client asked the node for what it may not do itself: a reply subject it may not receive on, a result topic it may not publish (403, or dropped)
	errKindMalformed   = "malformed"    // a broker message could not be used (dead-lettered)
	errKindForged      = "forged"       // a message whose origin is not validated, or a reply from another node than asked (dropped)
	errKindDeadLetter  = "dead_letter"  // a command exhausted its retry budget or had no route
	errKindOutboxFull  = "outbox_full"  // a submission was refused (507)
	errKindOutboxWrite = "outbox_write" // the outbox file could not be written
	errKindUnreachable = "unreachable"  // a request failed at once: link down, no host, node gone (503)
	errKindTimeout     = "timeout"      // a request passed its deadline (504)
	errKindHandler     = "handler"      // a command handler failed or timed out
	errKindNoRoute     = "no_route"     // the broker returned a mandatory message
	errKindNacked      = "nacked"       // the broker refused a message
	errKindLateReply   = "late_reply"   // a reply arrived after its deadline
	errKindDropped     = "dropped"      // a message with nobody to tell was dropped (system queue full, slow consumer, a reply whose node did not come back)
	errKindLink        = "link"         // the broker link failed
)

// metrics are the bridge's Prometheus collectors.
type metrics struct {
	*brokerlink.Metrics // the link's
	messages            *prometheus.CounterVec
	byShape             map[string][2]prometheus.Counter // messages' counters (in, out) of each shape, looked up once
	errors              *prometheus.CounterVec
	unseal              *prometheus.CounterVec
	// replays counts deliveries refused as replays, by shape and reason
	// (replay.go).
	replays *prometheus.CounterVec
	// scopeRefused counts what this node refused to send for a scope it is
	// not in, by kind (cap, stage, topic).
	scopeRefused *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	stalls       prometheus.Gauge
	// leaseExtensions counts handlers' progress messages that moved a
	// command's deadline (lease.go).
	leaseExtensions prometheus.Counter
	// deduplicated counts deliveries acked without calling the handler
	// because their id completed here before (completed.go), by stage.
	deduplicated *prometheus.CounterVec
	// retries counts failed commands put in their stage's retry queue, by
	// stage (retry.go); results counts command results published as
	// events (results.go); deadLetters is the number of dead letters in
	// each hosted stage's queue dead.<stage> at the last look.
	retries     *prometheus.CounterVec
	results     prometheus.Counter
	deadLetters *prometheus.GaugeVec
	// batchSize observes the commands of each batch message sent
	// (batch.go); batchSplits counts commands of a batch published again
	// alone for another attempt.
	batchSize   prometheus.Histogram
	batchSplits prometheus.Counter
	// overflowed counts submissions that went into the outbox on a far
	// link with the direct path full; parked counts answers held back
	// while the outbox's backlog was deep (submit.go, overflowRTT).
	overflowed prometheus.Counter
	parked     prometheus.Counter
	reg        registration
}

// registration is where the metrics are registered: the registry, what
// went into it (Unregister takes it out again), and the outbox's
// collectors, which come with the outbox.
type registration struct {
	to         prometheus.Registerer
	registered []prometheus.Collector
	outbox     []prometheus.Collector
}

func newMetrics(b *Bridge) *metrics {
	m := &metrics{
		Metrics: brokerlink.NewMetrics(),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_messages_total", Help: "Messages carried by the bridge, by shape and direction (out: to the broker, in: from it).",
		}, []string{"shape", "direction"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_errors_total", Help: "Failures seen by the bridge, by kind.",
		}, []string{"kind"}),
		unseal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_unseal_failures_total",
			Help: "Sealed messages from the broker that were refused, by shape and reason (tampered, unknown_key, not_sealed, expired, malformed, wrong_scope).",
		}, []string{"shape", "reason"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_replays_refused_total",
			Help: "Messages from the broker refused as replays, by shape and reason (dead_lettered, duplicate, expired).",
		}, []string{"shape", "reason"}),
		scopeRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_scope_refusals_total",
			Help: "Calls, submissions and events of local programs refused because their name is bound to a scope this node is not in, by kind (cap, stage, topic).",
		}, []string{"kind"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "meshbox_request_duration_seconds",
			Help:    "Round trip of requests forwarded to other nodes, by outcome (ok, error, timeout, unreachable).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"outcome"}),
		leaseExtensions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshbox_command_lease_extensions_total",
			Help: "Progress messages (Meshbox-Progress) of command handlers that extended a command's lease.",
		}),
		deduplicated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_commands_deduplicated_total",
			Help: "Command deliveries acked without calling the handler: their message id completed on this node within the stage's dedupe window.",
		}, []string{"stage"}),
		stalls: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshbox_stalls", Help: "Command stages currently stalled (see status stalls[]).",
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbox_command_retries_total",
			Help: "Failed commands put in their stage's retry queue to wait for their backoff, by stage.",
		}, []string{"stage"}),
		results: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshbox_command_results_total",
			Help: "Command results published as events on the command's Meshbox-Result-Topic.",
		}),
		deadLetters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbox_dead_letters",
			Help: "Dead letters waiting in the queue dead.<stage> of each stage hosted here, at the last look.",
		}, []string{"stage"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "meshbox", Subsystem: "command", Name: "batch_size",
			Help:    "Commands in each batch message this node sent (several commands for one stage in one broker message).",
			Buckets: []float64{2, 3, 4, 8, 16, 32, 64},
		}),
		batchSplits: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "meshbox", Subsystem: "command", Name: "batch_splits_total",
			Help: "Commands of a batch that failed an attempt and were published again alone for the next one.",
		}),
	}
	m.overflowed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "meshbox_submissions_overflowed_total",
		Help: "Commands and events of local programs stored in the outbox and answered on its commit while the link was up: the broker is far (5 ms or more) and 256 direct submissions already waited for its confirm.",
	})
	m.parked = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "meshbox_submission_answers_held_total",
		Help: "Answers to submitters held back until the broker took some of the outbox's backlog (over 8,192 messages waiting while the link is up).",
	})
	m.reg.outbox = []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meshbox_outbox_depth", Help: "Messages in the outbox."},
			func() float64 { return float64(b.outboxStatus().Depth) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meshbox_outbox_bytes", Help: "Bytes in the outbox."},
			func() float64 { return float64(b.outboxStatus().Bytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "meshbox_outbox_oldest_age_seconds", Help: "Age of the oldest message in the outbox (0 when empty)."},
			func() float64 { return b.outboxStatus().OldestAgeSeconds }),
	}
	m.byShape = map[string][2]prometheus.Counter{}
	for _, shape := range []string{codec.TypeRequest, codec.TypeReply, codec.TypeCommand, codec.TypeEvent, codec.TypeSystem} {
		m.byShape[shape] = [2]prometheus.Counter{m.messages.WithLabelValues(shape, "in"), m.messages.WithLabelValues(shape, "out")}
	}
	return m
}

// register registers every collector on reg (nil: none).
func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	m.reg.to = reg
	all := append(m.Metrics.Collectors(), m.messages, m.errors, m.unseal, m.replays, m.scopeRefused, m.duration, m.stalls, m.leaseExtensions, m.deduplicated, m.retries, m.results, m.deadLetters, m.batchSize, m.batchSplits, m.overflowed, m.parked)
	all = append(all, m.reg.outbox...)
	for _, c := range all {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				m.unregister()
				return errors.New("register metrics: meshbox_ bridge metrics are already registered")
			}
			m.unregister()
			return err
		}
		m.reg.registered = append(m.reg.registered, c)
	}
	return nil
}

func (m *metrics) unregister() {
	for _, c := range m.reg.registered {
		m.reg.to.Unregister(c)
	}
	m.reg.registered = nil
}

// msg counts a message; it runs for every message, so the counters of the
// known shapes are looked up once (byShape is never written after
// newMetrics).
func (m *metrics) msg(shape, direction string) {
	if c, ok := m.byShape[shape]; ok {
		switch direction {
		case "in":
			c[0].Inc()
			return
		case "out":
			c[1].Inc()
			return
		}
	}
	m.messages.WithLabelValues(shape, direction).Inc()
}

// Carried returns the requests, commands and events the bridge carried to
// and from the broker so far, both directions (meshbox_messages_total of
// those shapes): a rate is their growth over time.
func (b *Bridge) Carried() (requests, commands, events float64) {
	sum := func(shape string) float64 {
		var total float64
		for _, c := range b.m.byShape[shape] {
			var d dto.Metric
			if c.Write(&d) == nil {
				total += d.GetCounter().GetValue()
			}
		}
		return total
	}
	return sum(codec.TypeRequest), sum(codec.TypeCommand), sum(codec.TypeEvent)
}

func (m *metrics) err(kind string) { m.errors.WithLabelValues(kind).Inc() }

func (m *metrics) observe(outcome string, since time.Time) {
	m.duration.WithLabelValues(outcome).Observe(time.Since(since).Seconds())
}
