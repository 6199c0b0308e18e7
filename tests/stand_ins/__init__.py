"""Stand-ins for what the tests cannot have here: a GPU and the libraries that drive one."""
