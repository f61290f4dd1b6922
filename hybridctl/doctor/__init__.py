"""`hybridctl doctor`: judge the host, predict failures from the config, diagnose logs, write fixes."""
