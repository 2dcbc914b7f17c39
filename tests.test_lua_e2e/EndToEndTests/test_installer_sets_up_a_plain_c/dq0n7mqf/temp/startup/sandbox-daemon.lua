-- Written by the trapsandbox installer: makes `sandbox` runnable and starts its daemon.
shell.setAlias('sandbox', '/programs/sandbox.lua')
if multishell and shell.openTab then
  local tab = shell.openTab('/servers/sandbox.lua')
  if tab and multishell.setTitle then multishell.setTitle(tab, 'sandbox') end
  if tab and multishell.setFocus then multishell.setFocus(multishell.getCurrent()) end
else
  -- No multishell (a basic computer): run the daemon beside a fresh shell.
  parallel.waitForAny(
    function() shell.run('/servers/sandbox.lua') while true do os.pullEvent() end end,
    function() shell.run('/rom/programs/shell.lua') end
  )
  os.shutdown()
end
