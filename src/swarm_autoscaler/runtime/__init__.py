"""What the daemon and the keeper share as processes: logs, signals and the HTTP starter."""
