"""peft."""
