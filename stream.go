package relay

import "time"

// StreamConfig configures the handling of server-sent-event answers.
type StreamConfig struct {
	// IdleTimeout closes a stream that sent no byte for this long. If 0, 25 s.
	IdleTimeout time.Duration
}
