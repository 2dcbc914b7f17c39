
local args = { ... }
if not shell.openTab then printError('Requires multishell') return end
shell.openTab(table.unpack(args))
