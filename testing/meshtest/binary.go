package meshtest

func removeBinary() {}
