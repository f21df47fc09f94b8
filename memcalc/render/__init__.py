"""Reports shown to people: terminal, host, feed, plan, HTML and plots."""
