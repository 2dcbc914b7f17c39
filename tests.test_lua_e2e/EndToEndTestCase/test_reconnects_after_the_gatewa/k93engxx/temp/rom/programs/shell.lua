
while true do
  write('> ')
  local line = read()
  if line == 'exit' then return end
  shell.run(line)
end
