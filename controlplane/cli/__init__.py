"""The `hysync` command: the parser and exit statuses (main), the commands by what they act
on (switch_commands, testbed_commands, rack, top, completion), their shared output and
argument ranges."""
