package programs

import (
	"crypto/rand"
	"fmt"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

// mqttPasswordLen is the length of a program's MQTT password: 24 of 55
// letters and digits (138 bits), short enough to type into a device's
// web form.
const mqttPasswordLen = 24

// mqttAlphabet has no letters that read alike (no 0/O, 1/l/I).
const mqttAlphabet = "abcdefghjkmnpqrstuvwxyz23456789ABCDEFGHJKLMNPQRSTUVWXYZ"

// newMQTTPassword makes a password and its bcrypt hash (what the node's
// server compares a device's password with).
func newMQTTPassword() (password, hash string, err error) {
	var b [mqttPasswordLen]byte
	limit := 256 - 256%len(mqttAlphabet) // bytes at or past it would favour the first letters
	var buf [64]byte
	for n := 0; n < len(b); {
		if _, err := rand.Read(buf[:]); err != nil {
			return "", "", fmt.Errorf("new MQTT password: %w", err)
		}
		for _, x := range buf {
			if int(x) < limit && n < len(b) {
				b[n] = mqttAlphabet[int(x)%len(mqttAlphabet)]
				n++
			}
		}
	}
	h, err := bcrypt.GenerateFromPassword(b[:], bcrypt.DefaultCost)
	if err != nil {
		return "", "", fmt.Errorf("new MQTT password: %w", err)
	}
	return string(b[:]), string(h), nil
}

// isBcrypt reports whether s has the form of a bcrypt hash.
func isBcrypt(s string) bool {
	_, err := bcrypt.Cost([]byte(s))
	return err == nil && (strings.HasPrefix(s, "$2a$") || strings.HasPrefix(s, "$2b$") || strings.HasPrefix(s, "$2y$"))
}

// mqttFile is the content of a program's MQTT password file: comment
// lines, then the user name and the password on lines of their own.
func mqttFile(name, password string) []byte {
	return []byte("# MQTT credential of program " + name + " on this node's MQTT listener (nats_mqtt)\n" +
		"# Type the user name and the password into the device's MQTT settings.\n" +
		"user " + name + "\npassword " + password + "\n")
}

// ReadMQTT reads the user name and password of an MQTT password file.
func ReadMQTT(data []byte) (user, password string, err error) {
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "user "); ok {
			user = v
		} else if v, ok := strings.CutPrefix(line, "password "); ok {
			password = v
		}
	}
	if user == "" || password == "" {
		return "", "", fmt.Errorf("%w: not an MQTT password file (user and password lines)", ErrInvalid)
	}
	return user, password, nil
}

// MQTTPasswordMatches reports whether password is the one whose bcrypt
// hash is hash (Program.MQTTPassword).
func MQTTPasswordMatches(hash, password string) bool {
	return hash != "" && bcrypt.CompareHashAndPassword([]byte(hash), []byte(password)) == nil
}
