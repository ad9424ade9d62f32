package programs

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

// TestMQTTPasswordLifecycle: program add --mqtt makes a password file
// and keeps only its bcrypt hash in the definition; another add keeps
// the same password; an add without --mqtt and a remove void it.
func TestMQTTPasswordLifecycle(t *testing.T) {
	s, err := Open(Dir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	p := Program{Name: "plug1", MQTT: true, Publish: []string{"home.>"}}
	if _, err := s.Put(p); err != nil {
		t.Fatal(err)
	}
	user, password := readMQTTFile(t, s, "plug1")
	if user != "plug1" || len(password) != mqttPasswordLen {
		t.Fatalf("MQTT file: user %q password of %d characters, want plug1 and %d", user, len(password), mqttPasswordLen)
	}
	got, err := s.Get("plug1")
	if err != nil {
		t.Fatal(err)
	}
	if bcrypt.CompareHashAndPassword([]byte(got.MQTTPassword), []byte(password)) != nil {
		t.Fatal("the definition's hash does not match the password file")
	}
	def, _ := os.ReadFile(s.defPath("plug1"))
	if strings.Contains(string(def), password) {
		t.Fatal("the definition holds the password itself")
	}
	// A change of rights keeps the password.
	p.Subscribe = []string{"home.plug1.>"}
	if _, err := s.Put(p); err != nil {
		t.Fatal(err)
	}
	if _, again := readMQTTFile(t, s, "plug1"); again != password {
		t.Error("program add on the program changed its MQTT password")
	}
	// Without --mqtt: no password any more.
	p.MQTT = false
	if _, err := s.Put(p); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get("plug1"); got.MQTTPassword != "" || fileExists(s.MQTTPath("plug1")) {
		t.Errorf("without --mqtt: hash %q, file there %v; want neither", got.MQTTPassword, fileExists(s.MQTTPath("plug1")))
	}
	// Back with --mqtt: a new password; removed: gone.
	p.MQTT = true
	if _, err := s.Put(p); err != nil {
		t.Fatal(err)
	}
	if _, fresh := readMQTTFile(t, s, "plug1"); fresh == password {
		t.Error("a program given --mqtt again got its old password back")
	}
	if err := s.Remove("plug1"); err != nil {
		t.Fatal(err)
	}
	if fileExists(s.MQTTPath("plug1")) {
		t.Error("remove left the MQTT password file")
	}
}

// TestMQTTPasswordInDefinitionChecked: a definition whose mqtt_password
// is not a bcrypt hash (a password typed in, say), or one without mqtt,
// is refused, never taken as a plain password.
func TestMQTTPasswordInDefinitionChecked(t *testing.T) {
	for name, p := range map[string]Program{
		"plain text":   {Name: "a", MQTT: true, MQTTPassword: "hunter2"},
		"without mqtt": {Name: "a", MQTTPassword: "$2a$10$" + strings.Repeat("a", 53)},
	} {
		if err := p.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	_, hash, err := newMQTTPassword()
	if err != nil {
		t.Fatal(err)
	}
	if err := (Program{Name: "a", MQTT: true, MQTTPassword: hash}).Validate(); err != nil {
		t.Errorf("a bcrypt hash: %v", err)
	}
}

func readMQTTFile(t *testing.T, s *Store, name string) (string, string) {
	t.Helper()
	data, err := os.ReadFile(s.MQTTPath(name))
	if err != nil {
		t.Fatal(err)
	}
	user, password, err := ReadMQTT(data)
	if err != nil {
		t.Fatal(err)
	}
	return user, password
}
