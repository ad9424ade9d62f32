package bench

import (
	"slices"
	"testing"
)

// TestBalancedOrders checks that in balancedOrders(n) every order holds
// each fn once and each fn comes right after each other one equally
// often, for the sizes the benchmarks use and more.
func TestBalancedOrders(t *testing.T) {
	for n := 1; n <= 7; n++ {
		orders := balancedOrders(n)
		after := map[[2]int]int{}
		for _, o := range orders {
			if got := slices.Sorted(slices.Values(o)); !slices.Equal(got, seq(n)) {
				t.Fatalf("n=%d: order %v does not hold each of 0..%d once", n, o, n-1)
			}
			for k := 1; k < len(o); k++ {
				after[[2]int{o[k-1], o[k]}]++
			}
		}
		if n == 1 {
			continue
		}
		want := -1
		for i := range n {
			for j := range n {
				if i == j {
					continue
				}
				c := after[[2]int{i, j}]
				if want == -1 {
					want = c
				}
				if c == 0 || c != want {
					t.Fatalf("n=%d: %d comes right after %d %d times, want %d for every pair (orders %v)", n, j, i, c, want, orders)
				}
			}
		}
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}
