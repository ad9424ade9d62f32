package codec

// MaxRetryAttempts bounds the attempts of a stage's retry policy.
const MaxRetryAttempts = 1000
