package meshtest

import (
	"net/http"
	"testing"
)

// TestLeaseRabbitMQ: a test and its subtests share one leased broker; the
// next test to lease it finds none of the users the one before made.
func TestLeaseRabbitMQ(t *testing.T) {
	if testing.Short() {
		t.Skip("starts RabbitMQ")
	}
	t.Parallel() // its broker's boot overlaps the other tests' boots
	var first *Rabbit
	t.Run("make a user", func(t *testing.T) {
		first = LeaseRabbitMQ(t)
		t.Run("subtest", func(t *testing.T) {
			if r := LeaseRabbitMQ(t); r != first {
				t.Errorf("a subtest's lease: got broker %s, want its test's %s", r.node, first.node)
			}
		})
		user := map[string]string{"password": "pw", "tags": ""}
		if err := first.api(http.MethodPut, "/api/users/node.alpha.g1", user); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("find none", func(t *testing.T) {
		r := LeaseRabbitMQ(t)
		if r != first {
			t.Fatalf("the second lease: got broker %s, want the one returned (%s)", r.node, first.node)
		}
		var users []struct {
			Name string `json:"name"`
		}
		if err := r.apiInto(http.MethodGet, "/api/users", nil, &users); err != nil {
			t.Fatal(err)
		}
		if len(users) != 1 || users[0].Name != "guest" {
			t.Errorf("users on a broker leased again: got %+v, want guest only", users)
		}
	})
}
