package codec

const (
	MaxRetryAttempts = 1000
)
