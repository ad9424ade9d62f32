package bridge

// SetTestAfterDial makes every connection attempt of b run f once its
// connections are open, before the topology is declared: the seam for a
// broker that stalls during setup.
func SetTestAfterDial(b *Bridge, f func()) { b.testAfterDial = f }
