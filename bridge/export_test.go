package bridge

// SetTestAfterDial makes every connection attempt of b run f once its
// connections are open, before the topology is declared: the seam for a
// broker that stalls during setup.
func SetTestAfterDial(b *Bridge, f func()) { b.testAfterDial = f }

// StageConsumers returns the consumers b's current session has open on
// stage's queue now and the most it had open at once.
func StageConsumers(b *Bridge, stage string) (open, most int) { return b.stageConsumers(stage) }
