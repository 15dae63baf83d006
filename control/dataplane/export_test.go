package dataplane

// TableIDsByLookups lists the installed tables the way kernels before 6.14
// are read (see eachTable), for tests that compare both ways.
func (d *Dataplane) TableIDsByLookups() ([]uint32, error) {
	var ids []uint32
	err := d.eachTableByLookups(func(id, _ uint32) { ids = append(ids, id) })
	return ids, err
}

// EndedAge is how far back DeleteFlow dates an ended entry.
const EndedAge = endedAge
