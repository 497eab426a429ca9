"""The switch's state machine as data: `decision` holds the one table every target follows."""
