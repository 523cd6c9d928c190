module ferry.dev/tests/pause

go 1.25.0
