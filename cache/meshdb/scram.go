package meshdb

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

// scramIterations is the PBKDF2 iteration count of the verifiers this
// package makes: PostgreSQL's default (scram_iterations).
const scramIterations = 4096

// scramVerifier returns the SCRAM-SHA-256 verifier of password in the
// form PostgreSQL stores (RFC 5803, as CREATE ROLE ... PASSWORD accepts
// it): SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>. Given a
// verifier, the server keeps it as it is, so the password itself never
// reaches the database, its logs or its catalog. password must need no
// SASLprep (the generated ones are base64url).
func scramVerifier(password string) string {
	salt := randomBytes(16)
	salted, err := pbkdf2.Key(sha256.New, password, salt, scramIterations, sha256.Size)
	if err != nil {
		panic(err) // only for parameters FIPS mode refuses; these are fixed and valid
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return "SCRAM-SHA-256$" + strconv.Itoa(scramIterations) + ":" + b64(salt) + "$" + b64(storedKey[:]) + ":" + b64(serverKey)
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}
